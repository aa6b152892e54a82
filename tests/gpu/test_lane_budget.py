"""The GPU lane's time budget (no GPU needed, so it runs in `make test`): the bounds of its parts add up to less than
the Makefile's bound, which is under 8 minutes."""

from __future__ import annotations

import re
from pathlib import Path

from tests.gpu import lane
from tests.gpu.test_gpu_e2e import LEARN_TIMEOUT_S

REPO = Path(__file__).resolve().parents[2]


def test_the_lanes_bounds_fit_in_8_minutes() -> None:
    recipe = re.search(r"^test-gpu:.*\n\ttimeout (\d+) ", (REPO / "Makefile").read_text(), re.M)
    assert recipe and int(recipe.group(1)) == lane.LANE_S < 8 * 60
    assert LEARN_TIMEOUT_S + lane.MIN_RUNS_S + lane.BENCH_OVERHEAD_S + lane.MARGIN_S <= lane.LANE_S
    assert LEARN_TIMEOUT_S >= 1.5 * 108  # the default job's 107-108 s on an H100 (docs/benchmarks.md), with room
    assert lane.MIN_RUNS_S >= 225  # the three runs' 102 + 48 + 75 s on an H100 (2026-11-28)


def test_the_preemption_runs_share_what_the_learning_job_left(monkeypatch) -> None:
    """The runs get the lane's time left, together: MIN_RUNS_S at least after a learning job that took its whole
    bound, more after a faster one, and never past the lane's end."""
    started = lane._STARTED
    monkeypatch.setattr(lane.time, "monotonic", lambda: started + LEARN_TIMEOUT_S)
    assert lane.runs_left() >= lane.MIN_RUNS_S
    monkeypatch.setattr(lane.time, "monotonic", lambda: started + 108)  # the learning job took 108 s
    assert lane.runs_left() > lane.MIN_RUNS_S + 50
    assert 108 + lane.runs_left() + lane.BENCH_OVERHEAD_S + lane.MARGIN_S <= lane.LANE_S
