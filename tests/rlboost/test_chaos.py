"""Chaos across every role (rlboost.local.chaos, pure): the target list, who counts as caught at work, strict turns."""

from __future__ import annotations

import pytest

from rlboost.local.chaos import ChaosMonkey, caught_at_work, parse_targets
from rlboost.wire.rollout_io import ManagerStatus, Pool, WorkerStatus


def _worker(worker_id: str, inflight: int, pool: Pool = Pool.SPOT) -> WorkerStatus:
    return WorkerStatus(worker_id=worker_id, pool=pool, node="n", weight_version=1, running=2 if inflight else 0,
                        capacity=8, tokens_generated=inflight, draining=False, inflight_tokens=inflight)  # fmt: skip


def _status(*workers: WorkerStatus, pending: int = 0) -> ManagerStatus:
    running = sum(w.running for w in workers)
    return ManagerStatus(workers=list(workers), pending=pending, running=running, finished=0, migrations=0,
                         tokens_received=0)  # fmt: skip


def test_targets_parse_in_order_once_each_and_bad_ones_name_the_flag() -> None:
    assert parse_targets("spot") == ("spot",)
    assert parse_targets(" nats, trainer ,nats") == ("nats", "trainer")
    with pytest.raises(ValueError, match=r"--chaos-targets: unknown 'etcd'; give a comma list of spot, reserved"):
        parse_targets("spot,etcd")
    with pytest.raises(ValueError, match="--chaos-targets: empty"):
        parse_targets(" , ")


def test_caught_at_work_means_streaming_for_workers_and_manager_and_a_step_for_the_rest() -> None:
    idle = _status(_worker("spot-0", 0), _worker("reserved-0", 0, Pool.RESERVED))
    assert all(caught_at_work(t, ["x"], idle) == [] for t in ("manager", "weight-server", "nats", "trainer"))
    queued = _status(_worker("spot-0", 0), pending=16)  # a step asked for, nothing streamed yet
    assert caught_at_work("manager", ["rollout-manager"], queued) == []
    assert [v.name for v in caught_at_work("nats", ["nats"], queued)] == ["nats"]
    streaming = _status(_worker("spot-0", 0), _worker("reserved-0", 7, Pool.RESERVED))
    assert caught_at_work("spot", ["spot-0"], streaming) == []
    (victim,) = caught_at_work("reserved", ["reserved-0"], streaming)
    assert victim.doing == "2 running, 7 tokens in flight"
    (manager,) = caught_at_work("manager", ["rollout-manager"], streaming)
    assert "7 tokens in flight" in manager.doing


def test_roles_take_strict_turns_and_a_role_with_no_process_passes() -> None:
    monkey = ChaosMonkey(period_s=1.0, targets=("spot", "nats", "trainer"))
    live = {"spot": ["spot-0"], "nats": ["nats"], "trainer": ["trainer"]}
    assert monkey.pick(live, None) is None  # no status: never a blind kill
    step_only = _status(_worker("spot-0", 0), pending=4)
    assert monkey.pick(live, step_only) is None  # spot's turn, and it streams nothing: wait (NATS does not jump it)
    streaming = _status(_worker("spot-0", 5))
    assert monkey.pick(live, streaming).name == "spot-0"
    assert monkey.pick(live, streaming).name == "nats"
    assert monkey.pick({**live, "spot": []}, streaming).name == "trainer"
    assert monkey.pick({**live, "spot": []}, streaming).name == "nats"  # spot has no process: its turn passes


def test_an_unknown_target_is_refused() -> None:
    with pytest.raises(ValueError, match="--chaos-targets"):
        ChaosMonkey(period_s=1.0, targets=("spot", "gpu"))
