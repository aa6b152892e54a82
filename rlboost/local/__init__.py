"""`rlboost local`: every service as a separate process on 127.0.0.1, supervised by the CLI.

- `plan`: pure — ports, commands and flags of every child from the JobSpec.
- `supervisor`: child processes in their own process groups; start, watch, shutdown.
- `spot_trace`, `chaos`: when to kill and start spot workers (pure).
- `progress`, `report`: the live display and the JSON report.
- `runner`: ties them together (called by `rlboost.cli.local_cmd`).
"""
