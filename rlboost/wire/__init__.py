"""Typed structures for each boundary between services (domain types, no protobuf/HTTP inside).

- `rollout_io`: trainer/worker <-> rollout-manager (gRPC edge: `rollout_proto`).
- `weights_io`: trainer/worker <-> weight-server (HTTP JSON).
- `events`: NATS subjects and event payloads.
"""
