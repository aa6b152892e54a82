"""Prometheus metrics of the trainer (served on --metrics-port by rlboost.observability.serve_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from rlboost.wire.events import StepReport, ValidationReport, step_gauges

# Every gauge-declared StepReport field (rlboost.wire.events.gauge): field name -> its gauge, set after each step.
STEP_GAUGES = {field: Gauge(name, help_) for field, (name, help_) in step_gauges().items()}
WEIGHT_VERSION = STEP_GAUGES["weight_version"]  # also set when the starting weights are published
# Derived from StepReport fields rather than one field each.
STEP = Gauge("rlboost_trainer_step", "Last completed RL step (1-based count of optimizer steps)")
TOKENS_PER_SECOND = Gauge("rlboost_trainer_tokens_per_second", "Response tokens of the last step / its wall time")
STEP_SECONDS = Gauge("rlboost_trainer_step_seconds", "Wall time of the last step by phase", ["phase"])
TOKENS = Counter("rlboost_trainer_tokens_total", "Response tokens trained on")
RESPONSE_LENGTH = Gauge(
    "rlboost_trainer_response_length_tokens", "Response length in tokens of the last step's samples", ["stat"]
)
WORKERS_LOST = Counter(
    "rlboost_trainer_workers_lost_total",
    "Rollout workers gone from the manager between steps (preempted, crashed, drained), as the steps reported them",
)
PREEMPTIONS = Counter(
    "rlboost_trainer_preemptions_total",
    "Rollout workers preempted while holding requests (the manager's ledger), as the steps reported them",
)
# Counted as they happen, during the step.
TRAJECTORIES = Counter("rlboost_trainer_trajectories_total", "Trajectories received from the rollout-manager")
ROLLOUT_REATTACHES = Counter(
    "rlboost_trainer_rollout_reattaches_total",
    "Rollout calls made again after the rollout-manager was lost mid-step (it restarted): only missing samples",
)
OFF_POLICY = Counter("rlboost_trainer_off_policy_trajectories_total", "Trajectories skipped: older than maxStaleness")
PUBLISHED_BYTES = Counter("rlboost_trainer_published_bytes_total", "Weight payload bytes uploaded")
REWARD_FAILURES = Counter(
    "rlboost_trainer_reward_failures_total",
    "Samples whose reward call failed and scored 0 (rlboost.tasks.sandbox), by reason: timeout, crash, cpu, memory, "
    "refused (network, a process or exec of text), exception, bad_value (not a finite number).",
    ["reason"],
)
PROMPTS_SKIPPED = Counter(
    "rlboost_trainer_prompts_skipped_total", "Dataset prompts skipped: longer than task.dataset.maxPromptTokens"
)
STALE = Counter("rlboost_trainer_stale_trajectories_total", "Trajectories accepted within algorithm.maxStaleness")
BASELINE_EXCLUDED = Counter(
    "rlboost_trainer_baseline_excluded_total",
    "Samples kept out of their group's baseline (advantage 0): dropped, reward failed or too stale",
)
FAILED = Counter(
    "rlboost_trainer_failed_trajectories_total",
    "Samples the rollout-manager dropped after rollout.maxRequestAttempts (rollout.onFailedRequest: drop): zero weight",
)
STEP_DEADLINES = Counter(
    "rlboost_trainer_step_deadlines_total", "Step rollouts that passed rollout.stepDeadlineS, by outcome", ["outcome"]
)
# Colocation (trainer.colocateReserved): release / resume handshakes with the reserved workers.
COLOCATION_WAIT_SECONDS = Histogram(
    "rlboost_trainer_colocation_wait_seconds",
    "Seconds the trainer waited for the colocated workers' acks per step, by action (release, resume).",
    ["action"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
COLOCATION_ACKS = Counter("rlboost_trainer_colocation_acks_total", "Colocation acks received, by action.", ["action"])
COLOCATION_ACKS_REFUSED = Counter(
    "rlboost_trainer_colocation_acks_refused_total",
    "Colocation acks not counted because their MAC is not the named worker's, by reason (mac_missing, mac_invalid).",
    ["reason"],
)
COLOCATION_TIMEOUTS = Counter(
    "rlboost_trainer_colocation_timeouts_total", "Release / resume phases whose acks did not all arrive.", ["action"]
)
COLOCATION_RELEASE_WAIT = Gauge(
    "rlboost_trainer_colocation_release_wait_seconds", "Time the last step waited for the release acks."
)


# Evaluation (spec.evaluation): set when a step's report carries one (rlboost.wire.events.ValidationReport).
VALIDATION = {
    field: Gauge(f"rlboost_trainer_validation_{field}", help_)
    for field, help_ in (
        ("reward_mean", "Mean reward of the last evaluation's responses on the validation prompts."),
        ("pass_at_1", "Unbiased pass@1 of the last evaluation."),
        ("pass_at_k", "Unbiased pass@k of the last evaluation, k = evaluation.samples."),
        ("response_tokens_mean", "Mean response length in tokens of the last evaluation."),
        ("step", "Step after which the last evaluation ran (1-based count of optimizer steps)."),
    )
}


def export_validation(report: ValidationReport) -> None:
    for field, g in VALIDATION.items():
        g.set(report.step + 1 if field == "step" else getattr(report, field))


def export_step(report: StepReport) -> None:
    """Set every step gauge from the step's record: one per gauge field, then the derived ones; the step count
    last, so a scrape that sees the new step sees all of its values."""
    for field, g in STEP_GAUGES.items():
        g.set(getattr(report, field))
    TOKENS.inc(report.tokens)
    wall = report.rollout_seconds + report.train_seconds + report.sync_seconds
    TOKENS_PER_SECOND.set(report.tokens / wall if wall > 0 else 0.0)
    for phase in ("rollout", "train", "sync"):
        STEP_SECONDS.labels(phase).set(getattr(report, f"{phase}_seconds"))
    for stat in ("p50", "p90", "max"):
        RESPONSE_LENGTH.labels(stat).set(report.response_length.get(stat, 0.0))
    WORKERS_LOST.inc(report.workers_lost)
    PREEMPTIONS.inc(report.preemptions)
    if report.validation is not None:
        export_validation(report.validation)
    STEP.set(report.step + 1)


# ---- the publisher's per-step work (issue 34: no wasted encode, no version listing per step) ----
DELTA_CHOICES = Counter(
    "rlboost_trainer_delta_choices_total",
    "Delta-or-snapshot choices of the weight publisher: sent (encoded, sent), too_large (encoded, dropped), "
    "not_encoded (a count of changed elements showed it too large)",
    ["outcome"],
)
VERSION_LISTINGS = Counter(
    "rlboost_trainer_version_listings_total",
    "Version lists asked of the weight-server (the start, a resume, after an upload error)",
)
