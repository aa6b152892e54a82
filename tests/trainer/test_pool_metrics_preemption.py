"""What preemptions cost, per step (pool_metrics.PoolMeter): the differences of the manager's totals between two
status reads, and their share; a restarted manager (its totals fell) counts anew."""

from __future__ import annotations

import pytest

from rlboost.spec import JobSpec
from rlboost.wire.rollout_io import ManagerStatus
from trainer.pool_metrics import PoolMeter


def _status(preemptions: int, lost: float, slots: float) -> ManagerStatus:
    return ManagerStatus([], 0, 0, 0, 0, 0, preemptions=preemptions, preempted_slot_seconds=lost, slot_seconds=slots)


def test_each_step_gets_the_preemption_cost_since_the_previous_step() -> None:
    meter = PoolMeter(JobSpec(), now=0.0)
    first = meter.update(_status(1, 2.0, 40.0), now=5.0).preemption
    assert first == {
        "preemptions": 1,
        "preempted_slot_seconds": 2.0,
        "rollout_slot_seconds": 40.0,
        "preempted_slot_share": 0.05,
    }
    second = meter.update(_status(3, 12.0, 60.0), now=10.0).preemption
    assert (second["preemptions"], second["preempted_slot_seconds"], second["rollout_slot_seconds"]) == (2, 10.0, 20.0)
    assert second["preempted_slot_share"] == pytest.approx(0.5)
    restarted = meter.update(_status(0, 1.0, 8.0), now=15.0).preemption  # a new manager: its totals start at 0
    assert (restarted["preemptions"], restarted["preempted_slot_seconds"], restarted["preempted_slot_share"]) == (
        0,
        1.0,
        0.125,
    )


def test_a_step_without_slots_or_status_reports_no_share() -> None:
    meter = PoolMeter(JobSpec(), now=0.0)
    assert meter.update(_status(0, 0.0, 0.0), now=1.0).preemption["preempted_slot_share"] == 0.0
    assert meter.update(None, now=2.0).preemption == {}
    assert meter.update(_status(1, 30.0, 10.0), now=3.0).preemption["preempted_slot_share"] == 1.0  # capped
