"""rollout_manager service."""
