"""The cluster lane's modules live in scripts/cluster/ (they are run as scripts, not imported by the product);
the tests import them from there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LANE_DIR = Path(__file__).resolve().parents[2] / "scripts" / "cluster"
if str(LANE_DIR) not in sys.path:
    sys.path.insert(0, str(LANE_DIR))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The lane takes many minutes: it runs when asked for (`-m cluster`, `make test-cluster`), not in `make test`."""
    if "cluster" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="the cluster lane runs with `make test-cluster` (pytest -m cluster)")
    for item in items:
        if item.get_closest_marker("cluster"):
            item.add_marker(skip)
