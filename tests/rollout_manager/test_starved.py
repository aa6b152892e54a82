"""A step that cannot make progress says why (issue 31 item 6): pending requests with no worker to take them are
logged with the reason once they waited 30 s, again every 30 s, and exported as rlboost_manager_starved_seconds
(pure: the clock is handed in)."""

from __future__ import annotations

import logging
from collections import Counter

from prometheus_client import REGISTRY

from rlboost.wire.rollout_io import Pool, WorkerRegistration
from rollout_manager.records import Worker
from rollout_manager.starved import StarvedWork, why_starved


def _worker(version: int, **state: bool) -> Worker:
    w = Worker(WorkerRegistration("w0", Pool.SPOT, "n", 4, version, "torch"), version=version, last_seen=0.0)
    for name, value in state.items():
        setattr(w, name, value)
    return w


def test_why_pending_work_cannot_be_placed() -> None:
    pending = Counter({3: 16})
    assert why_starved(pending, []).startswith("no rollout worker is registered")
    assert why_starved(pending, [_worker(3, expired=True)]).startswith("no rollout worker is registered")
    assert why_starved(pending, [_worker(2)]).startswith("no registered worker holds weight version [3]")
    assert why_starved(pending, [_worker(3)]) == "" and why_starved(Counter(), []) == ""


def test_it_is_said_after_30_s_then_every_30_s_and_the_gauge_follows(caplog) -> None:
    starved = StarvedWork(after_s=30.0)
    pending = Counter({0: 8})
    with caplog.at_level(logging.WARNING, logger="rollout_manager.starved"):
        for now in (0.0, 10.0, 29.0, 30.0, 45.0, 61.0):
            starved.check(now, pending, [])
    said = [r for r in caplog.records if r.getMessage() == "pending requests cannot be placed"]
    assert [r.seconds for r in said] == [30.0, 61.0] and "no rollout worker is registered" in said[0].why
    assert REGISTRY.get_sample_value("rlboost_manager_starved_seconds") == 61.0
    assert starved.check(62.0, pending, [_worker(0)]) == 0.0  # a worker came: work goes on
    assert REGISTRY.get_sample_value("rlboost_manager_starved_seconds") == 0.0
