"""Prometheus metrics of the trainer (served on --metrics-port by rlboost.observability.serve_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STEP = Gauge("rlboost_trainer_step", "Last completed RL step (1-based count of optimizer steps)")
WEIGHT_VERSION = Gauge("rlboost_trainer_weight_version", "Last weight version published")
REWARD_MEAN = Gauge("rlboost_trainer_reward_mean", "Mean reward of the last step's samples")
REWARD_STD = Gauge("rlboost_trainer_reward_std", "Standard deviation of the last step's rewards")
LOSS = Gauge("rlboost_trainer_loss", "GRPO clipped loss of the last step")
GRAD_NORM = Gauge("rlboost_trainer_grad_norm", "Global gradient norm of the last step (before clipping)")
LEARNING_RATE = Gauge("rlboost_trainer_learning_rate", "Learning rate of the last step")
CLIP_FRACTION = Gauge("rlboost_trainer_clip_fraction", "Fraction of response tokens whose ratio was clipped")
LOGP_DIFF = Gauge("rlboost_trainer_logprob_abs_diff", "Mean |trainer log-prob - worker log-prob| per token")
TOKENS_PER_SECOND = Gauge("rlboost_trainer_tokens_per_second", "Response tokens of the last step / its wall time")
STEP_SECONDS = Gauge("rlboost_trainer_step_seconds", "Wall time of the last step by phase", ["phase"])
TOKENS = Counter("rlboost_trainer_tokens_total", "Response tokens trained on")
TRAJECTORIES = Counter("rlboost_trainer_trajectories_total", "Trajectories received from the rollout-manager")
OFF_POLICY = Counter("rlboost_trainer_off_policy_trajectories_total", "Trajectories skipped: older than maxStaleness")
PUBLISHED_BYTES = Counter("rlboost_trainer_published_bytes_total", "Weight payload bytes uploaded")
STALE = Counter("rlboost_trainer_stale_trajectories_total", "Trajectories accepted within algorithm.maxStaleness")
KL = Gauge("rlboost_trainer_kl", "Mean k3 KL to the reference policy per response token (0 without klCoef)")
ENTROPY = Gauge("rlboost_trainer_entropy", "Mean policy entropy per response token of the last step")
IDLE_SECONDS = Gauge("rlboost_trainer_idle_seconds", "Rank 0's time without compute between request and step")
COMPUTE_SECONDS = Gauge("rlboost_trainer_compute_seconds", "Rank 0's forward/backward + optimizer time of a step")
# Colocation (trainer.colocateReserved): release / resume handshakes with the reserved workers.
COLOCATION_WAIT_SECONDS = Histogram(
    "rlboost_trainer_colocation_wait_seconds",
    "Seconds the trainer waited for the colocated workers' acks per step, by action (release, resume).",
    ["action"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
COLOCATION_ACKS = Counter("rlboost_trainer_colocation_acks_total", "Colocation acks received, by action.", ["action"])
COLOCATION_TIMEOUTS = Counter(
    "rlboost_trainer_colocation_timeouts_total", "Release / resume phases whose acks did not all arrive.", ["action"]
)
COLOCATION_RELEASE_WAIT = Gauge(
    "rlboost_trainer_colocation_release_wait_seconds", "Time the last step waited for the release acks."
)
