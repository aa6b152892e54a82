"""`rlboost simulate`: a whole RL job at cluster scale, replayed from a real spot trace.

Modelled engines (a roofline of decode on H100s) and a modelled trainer, driven by the
rollout-manager's real policy code (`rlboost.policies`: placement, offload window). Compares
reserved-only (colocated), disaggregated (fixed split), the paper's hybrid and rlboost (the hybrid
with issue 17's policies) on the same trace and workload. See docs/simulation.md for the model and its assumptions.

    rlboost simulate --trace traces/bamboo/<file>.csv --json --plot out.png
"""
