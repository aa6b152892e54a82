"""rollout_worker service."""
