"""Generated gRPC stubs of rlboost.rollout.v1 (see protos/ and scripts/gen_protos.py)."""
