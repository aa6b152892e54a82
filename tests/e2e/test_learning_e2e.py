"""Learning end to end: the embedded default job, run for 40 steps, raises its mean reward.

Every service is a real process (`rlboost local`); the seed is fixed, sampling is seeded per sample
and micro-batches are fixed in advance, so the run is reproducible. The bar: the mean reward of the
last 10 steps beats the first 10 by at least 0.08 (measured: 0.29 -> 0.47 on this machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_default_job_learns(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    run_local("--steps", "40", "--run-dir", tmp_path / "run", "--json-report", report_path)
    rewards = [s["reward_mean"] for s in json.loads(report_path.read_text())["steps"]]
    assert len(rewards) == 40
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    assert last >= first + 0.08, f"mean reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}"
    assert (tmp_path / "run" / "reward.png").stat().st_size > 5_000


@pytest.mark.slow
def test_two_rank_zero2_job_learns(tmp_path: Path) -> None:
    """Issue 5's bar: the default job on 2 trainer ranks (gloo) under ZeRO-2 learns as well."""
    config = tmp_path / "zero2.yaml"
    config.write_text("trainer:\n  zeroStage: 2\n")
    report_path = tmp_path / "report.json"
    run_local(
        "--config", config, "--trainer-ranks", "2", "--steps", "40", "--run-dir", tmp_path / "run",
        "--json-report", report_path,
    )  # fmt: skip
    steps = json.loads(report_path.read_text())["steps"]
    rewards = [s["reward_mean"] for s in steps]
    assert len(rewards) == 40 and all(s["ranks"] == 2 for s in steps)
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    assert last >= first + 0.08, f"mean reward did not rise on 2 ranks: first 10 steps {first:.3f}, last 10 {last:.3f}"
