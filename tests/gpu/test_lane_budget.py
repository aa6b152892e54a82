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
    assert LEARN_TIMEOUT_S + lane.bench_timeout() + lane.MARGIN_S <= lane.LANE_S
    assert LEARN_TIMEOUT_S >= 1.5 * 107  # the default job's 107 s on an H100 (docs/benchmarks.md), with room


def test_the_preemption_runs_share_what_the_learning_job_left(monkeypatch) -> None:
    """Each run gets the lane's time left shared by the runs: RUN_TIMEOUT_S at least after a learning job that took
    its whole bound, more (up to RUN_TIMEOUT_MAX_S) after a faster one."""
    started = lane._STARTED
    monkeypatch.setattr(lane.time, "monotonic", lambda: started + LEARN_TIMEOUT_S)
    assert lane.RUN_TIMEOUT_S <= lane.run_timeout_left() < lane.RUN_TIMEOUT_MAX_S
    monkeypatch.setattr(lane.time, "monotonic", lambda: started + 60)  # the learning job took 60 s
    assert lane.run_timeout_left() == lane.RUN_TIMEOUT_MAX_S
    runs_end = 60 + lane.bench_timeout(run_timeout=lane.run_timeout_left())
    assert runs_end + lane.MARGIN_S <= lane.LANE_S
