"""The trainer/worker log-prob gap of a step reaches every place a step's numbers go: the StepReport (from the
step's LossStats), the trainer's Prometheus gauges, the `rlboost local` display, its plain step line and summary."""

from __future__ import annotations

from prometheus_client import REGISTRY
from rich.console import Console

from rlboost.local.progress import ProgressState, render, step_line, summary_table
from rlboost.wire.events import StepReport
from trainer import metrics
from trainer.grpo import LossStats
from trainer.reporting import gap_fields


def _report(**fields) -> StepReport:
    base = dict(step=3, weight_version=4, weights_checksum="c", reward_mean=0.5, tokens=64, rollout_seconds=1.0)
    return StepReport(**base, train_seconds=0.5, sync_seconds=0.1, **fields)


def _text(renderable) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_steps_gap_fields_come_from_its_loss_statistics():
    stats = LossStats(100, 0, 100.0, 0.0, mismatch_tokens=40, mismatch_sum=0.048, mismatch_max=0.019)
    stats.corrected_tokens = 5
    fields = gap_fields(stats, excluded=2)
    assert fields == {
        "logprob_mismatch_mean": 0.048 / 40,
        "logprob_mismatch_max": 0.019,
        "rollout_correction_fraction": 0.05,
        "baseline_excluded": 2,
    }
    assert gap_fields(LossStats(0, 0, 0.0, 0.0), excluded=0)["logprob_mismatch_mean"] == 0.0  # no worker log-probs


def test_the_gap_is_a_gauge_and_in_the_display_line_and_summary():
    report = _report(logprob_mismatch_mean=1.2e-3, logprob_mismatch_max=1.9e-2, rollout_correction_fraction=0.1)
    metrics.export_step(report)
    assert REGISTRY.get_sample_value("rlboost_trainer_logprob_mismatch_mean") == 1.2e-3
    assert REGISTRY.get_sample_value("rlboost_trainer_logprob_mismatch_max") == 1.9e-2
    assert REGISTRY.get_sample_value("rlboost_trainer_rollout_correction_fraction") == 0.1
    assert "logp gap 1.2e-03/1.9e-02" in step_line(report, 10)
    state = ProgressState(total_steps=10, steps=[report])
    live = _text(render(state))
    assert "logp gap" in live and "1.2e-03/1.9e-02" in live
    assert "1.2e-03/1.9e-02" in _text(summary_table([report]))
