"""Busy sizing (rollout.spot.sizing 'busy'), the pure part: a step report moves the target, the status keeps it,
the spot ask is the lower of the nodes' capacity and the target."""

from __future__ import annotations

from typing import Any

import pytest

from rlboost.spec import JobSpec, SpecFieldError
from rlboost.wire.events import StepReport
from rlboost_operator import spot_busy


def _spec(sizing: str = "busy", lo: int = 1, hi: int = 8) -> JobSpec:
    return JobSpec.model_validate(
        {
            "trainer": {"ranks": 1, "gpusPerRank": 1},
            "rollout": {
                "reserved": {"replicas": 1, "gpusPerWorker": 1},
                "spot": {"sizing": sizing, "minReplicas": lo, "maxReplicas": hi, "gpusPerWorker": 1},
            },
            "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.5},
        }
    )


def _report(spot: int, busy: float, wait_s: float, step_s: float = 100.0) -> StepReport:
    return StepReport(
        step=0,
        weight_version=1,
        weights_checksum="x",
        reward_mean=0.0,
        tokens=1,
        rollout_seconds=step_s,
        train_seconds=0.0,
        sync_seconds=0.0,
        trainer_idle_seconds=wait_s,
        pool_workers={"spot": spot},
        spot_busy_fraction=busy,
    )


def _node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"cloud.google.com/gke-spot": "true"}},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_idle_spot_shrinks_and_busy_spot_with_a_waiting_trainer_grows() -> None:
    spec = _spec()
    assert spot_busy.scaler(spec, None).target == 8  # none yet: start at maxReplicas (use what exists, then trim)
    shrunk = spot_busy.next_target(spec, 8, _report(spot=8, busy=0.05, wait_s=0.0))
    assert 1 <= shrunk < 8
    assert spot_busy.next_target(spec, shrunk, _report(spot=shrunk, busy=0.95, wait_s=50.0)) > shrunk
    assert spot_busy.next_target(spec, 4, _report(spot=4, busy=0.95, wait_s=0.0)) == 4  # nobody waits: unchanged


def test_the_target_stays_within_the_spec_bounds_and_a_spec_edit_applies() -> None:
    assert spot_busy.next_target(_spec(lo=3), 8, _report(spot=8, busy=0.0, wait_s=0.0)) == 3
    assert spot_busy.next_target(_spec(hi=5), 5, _report(spot=5, busy=1.0, wait_s=90.0)) == 5
    assert spot_busy.scaler(_spec(hi=2), 6).target == 2  # maxReplicas lowered since the status was written


def test_the_target_round_trips_through_the_status_and_bad_values_start_afresh() -> None:
    spec = _spec()
    target = spot_busy.next_target(spec, None, _report(spot=8, busy=0.1, wait_s=0.0))
    assert spot_busy.saved_target({"spotTarget": target}) == target
    for bad in ({}, None, {"spotTarget": None}, {"spotTarget": "3"}, {"spotTarget": -1}, {"spotTarget": True}):
        assert spot_busy.saved_target(bad) is None


def test_the_ask_is_the_lower_of_the_nodes_capacity_and_the_target() -> None:
    spec, nodes = _spec(), [_node("a", 2), _node("b", 4)]  # 6 workers fit
    assert spot_busy.busy_decision(nodes, spec, 3).replicas == 3
    assert spot_busy.busy_decision(nodes, spec, None).replicas == 6
    assert spot_busy.busy_decision([], spec, 3).replicas == 1  # no nodes: minReplicas, as capacity sizing
    assert spot_busy.busy_decision(nodes, spec, 3).reason == spot_busy.BUSY


def test_sizing_busy_is_opt_in_and_checked() -> None:
    assert spot_busy.busy_sized(_spec()) and not spot_busy.busy_sized(_spec("default"))
    with pytest.raises((SpecFieldError, ValueError), match="sizing"):
        _spec("busiest")
