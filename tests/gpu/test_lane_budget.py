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
