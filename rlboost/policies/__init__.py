"""Scheduling policies shared by the rollout-manager and the simulator: pure, no network, no clock.

- `placement`: least-loaded worker holding the weight version, or by measured speed (slow or far workers get fewer
  effective slots and the shortest expected work, the fast ones the longest); which workers move to a newer version.
- `balancing`: move work off overloaded workers to idle ones.
- `speed_rebalance`: at a step's end, the longest-running responses off slow workers to fast idle ones.
- `migration`: how a request continues elsewhere from prompt + generated tokens.
- `offload`: RLBoost's adaptive partial-response offload window T.
- `length_offload`: at the offload window, the longest-running requests first, to the least-loaded spot workers.
- `spot_scaling`: how many of the available spot instances to use, from how busy they were; `BusySpotScaler`
  pays only for busy spot, with the prices per pool.
- `partial_rollout`: partial rollout's step rules (groups in flight, when a step's stream ends, the staleness
  bound on what is trained and carried), shared by the trainer, the manager and the simulator.
"""
