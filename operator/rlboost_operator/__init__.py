"""rlboost Kubernetes operator (kopf)."""
