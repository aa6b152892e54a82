"""Typed structures for each boundary between services (domain types, no protobuf/HTTP inside).

- `rollout_io`: trainer/worker <-> rollout-manager (gRPC edge: `rollout_proto`).
- `weights_io`: trainer/worker <-> weight-server (HTTP JSON); `weight_routes`: its HTTP routes, spelled once.
- `peers_io`: worker <-> weight-server's peer directory, and worker <-> worker payload reads.
- `events`: NATS event payloads, and the table of topics pairing each subject with its payload type.
"""
