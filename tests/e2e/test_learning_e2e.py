"""Learning end to end: the embedded default job, run for 40 steps, raises its mean reward.

Every service is a real process (`rlboost local`); the seed is fixed, sampling is seeded per sample
and micro-batches are fixed in advance, so the run is reproducible. The bar: the mean reward of the
last 10 steps beats the first 10 by at least 0.08 (measured: 0.29 -> 0.47 on this machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_default_job_learns(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", "--steps", "40",
           "--run-dir", str(tmp_path / "run"), "--json-report", str(report_path)]  # fmt: skip
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"rlboost local did not finish in 900 s; output:\n{err.stdout}\n{err.stderr}")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    rewards = [s["reward_mean"] for s in json.loads(report_path.read_text())["steps"]]
    assert len(rewards) == 40
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    assert last >= first + 0.08, f"mean reward did not rise: first 10 steps {first:.3f}, last 10 {last:.3f}"
    assert (tmp_path / "run" / "reward.png").stat().st_size > 5_000
