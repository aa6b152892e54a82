"""Scheduling policies shared by the rollout-manager and the simulator (pure: no network, no clock).

- `placement`: which worker gets a pending request.
- `offload`: the adaptive partial-response offload window T (RLBoost).
"""
