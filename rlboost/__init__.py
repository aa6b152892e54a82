"""rlboost: RL post-training on spot GPUs with sparse, bit-exact weight sync (core library)."""
