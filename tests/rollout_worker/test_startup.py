"""A worker's start-up split (startup.py): its process start from the kernel, each part's seconds as a log field and
a gauge, and the first assignment counted once."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from prometheus_client import REGISTRY

from rollout_worker.startup import StartupClock, process_started_at


def _gauge(part: str) -> float | None:
    return REGISTRY.get_sample_value("rlboost_worker_startup_seconds", {"part": part})


def test_process_start_is_the_kernels_not_the_clocks_creation() -> None:
    started = process_started_at()
    # pytest imported torch-free modules and collected tests before this line: the process is older than now
    assert started < time.time()
    clock = StartupClock()
    assert clock.started_at == pytest.approx(started, abs=0.02)
    assert clock.parts["process"] > 0.1 and _gauge("process") == clock.parts["process"]  # imports took time


def test_parts_ready_and_first_assignment(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_worker")
    clock = StartupClock()

    async def work() -> str:
        await asyncio.sleep(0.05)  # the work being timed, not synchronisation
        return "done"

    assert asyncio.run(clock.timed("assets", work())) == "done"
    assert clock.parts["assets"] >= 0.05 and _gauge("assets") == clock.parts["assets"]
    clock.ready("spot-3")
    (ready,) = [r for r in caplog.records if r.getMessage() == "start-up"]
    assert ready.worker_id == "spot-3" and ready.assets_s == round(clock.parts["assets"], 3)
    assert ready.ready_s >= ready.assets_s  # the process started before the assets were pulled
    clock.assigned("spot-3")
    first = clock.parts["first_assignment"]
    clock.assigned("spot-3")  # a later assignment is no start-up
    assert clock.parts["first_assignment"] == first and _gauge("first_assignment") == first
    assert len([r for r in caplog.records if r.getMessage() == "first assignment"]) == 1
