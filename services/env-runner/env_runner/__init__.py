"""The env-runner service: runs a job's environment and drives its agentic episodes through the rollout-manager."""
