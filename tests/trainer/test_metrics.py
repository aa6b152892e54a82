"""The trainer's step gauges come from the step's one record (rlboost.wire.events.StepReport), field by field.

In-process: `trainer.metrics.export_step` against the real prometheus_client registry.
"""

from __future__ import annotations

from prometheus_client import REGISTRY

from rlboost.wire.events import StepReport, step_gauges
from trainer import metrics

# Numeric fields that are not a gauge of their own, and where they go instead. A new numeric field fails
# test_every_numeric_field_is_a_gauge_or_said_otherwise until it is declared with `gauge(...)` or listed here.
DERIVED = {"step", "tokens", "rollout_seconds", "train_seconds", "sync_seconds"}  # step count, tokens, tokens/s, phases
# *_total counters, per trajectory (sync_bytes: rlboost_trainer_published_bytes_total; baseline_excluded:
# rlboost_trainer_baseline_excluded_total)
COUNTED_DURING_THE_STEP = {"trajectories", "off_policy", "stale", "sync_bytes", "baseline_excluded"}
# workers_lost, migrations, cost_so_far, spot_busy_fraction: the manager's and the operator's own metrics say these
RECORD_ONLY = {
    "first_trajectory_seconds",
    "ranks",
    "colocation_released",
    "colocation_resumed",
    "colocation_wait_seconds",
    "workers_lost",
    "migrations",
    "cost_so_far",
    "prompts_skipped",
    "data_epoch",
    "carried_over",  # partial rollout: the manager counts carries (rlboost_manager_carried_requests_total)
    "stale_tokens",
    "spot_busy_fraction",
    "preemptions",  # rlboost_trainer_preemptions_total (and the manager's rlboost_manager_preemptions_total)
    # agentic episodes: the env-runners count these (rlboost_env_runner_tool_calls_total, ..._tool_failures_total,
    # ..._environment_failures_total, ..._turns_per_episode)
    "episode_turns_max",
    "tool_calls",
    "tool_failures",
    "environment_failures",
}  # prompts_skipped: rlboost_trainer_prompts_skipped_total


def _report() -> StepReport:
    """A record whose numeric fields all differ, so a gauge set from the wrong field shows."""
    floats = {name: 0.001 * (i + 1) for i, name in enumerate(step_gauges()) if name != "weight_version"}
    return StepReport(
        step=6,
        weight_version=7,
        weights_checksum="ab",
        tokens=120,
        rollout_seconds=2.0,
        train_seconds=0.5,
        sync_seconds=0.5,
        finish_reasons={"stop": 4},
        **floats,
    )


def _numeric_fields() -> set[str]:
    return {name for name, info in StepReport.model_fields.items() if info.annotation in (int, float)}


def test_every_gauge_field_is_exported_with_its_value() -> None:
    record = _report()
    tokens_before = REGISTRY.get_sample_value("rlboost_trainer_tokens_total") or 0.0
    metrics.export_step(record)
    for field, (name, _help) in step_gauges().items():
        assert REGISTRY.get_sample_value(name) == getattr(record, field), field
    assert REGISTRY.get_sample_value("rlboost_trainer_step") == 7  # a 1-based count of steps
    assert REGISTRY.get_sample_value("rlboost_trainer_tokens_total") - tokens_before == 120
    assert REGISTRY.get_sample_value("rlboost_trainer_tokens_per_second") == 40.0
    for phase, seconds in (("rollout", 2.0), ("train", 0.5), ("sync", 0.5)):
        assert REGISTRY.get_sample_value("rlboost_trainer_step_seconds", {"phase": phase}) == seconds


def test_every_numeric_field_is_a_gauge_or_said_otherwise() -> None:
    gauges = set(step_gauges())
    said = DERIVED | COUNTED_DURING_THE_STEP | RECORD_ONLY
    assert not gauges & said
    assert _numeric_fields() == gauges | said


def test_gauge_names_stay_the_dashboards_names() -> None:
    names = {name for name, _help in step_gauges().values()}
    assert {
        "rlboost_trainer_weight_version",
        "rlboost_trainer_reward_mean",
        "rlboost_trainer_idle_seconds",
        "rlboost_trainer_compute_seconds",
        "rlboost_trainer_logprob_abs_diff",
    } <= names
    assert all(help_ for _name, help_ in step_gauges().values())
