"""Chaos across every role (rlboost.local.chaos, pure): the target list, who counts as caught at work, strict turns;
and its pacing by the job's progress (the runner's SpotController, with a real child process as the victim)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlboost.local.chaos import ChaosMonkey, caught_at_work, parse_targets
from rlboost.local.restarts import Restarts
from rlboost.local.runner import SpotController
from rlboost.local.supervisor import Supervisor
from rlboost.wire.rollout_io import ManagerStatus, Pool, WorkerStatus


def _worker(worker_id: str, inflight: int, pool: Pool = Pool.SPOT) -> WorkerStatus:
    return WorkerStatus(
        worker_id=worker_id,
        pool=pool,
        node="n",
        weight_version=1,
        running=2 if inflight else 0,
        capacity=8,
        tokens_generated=inflight,
        draining=False,
        inflight_tokens=inflight,
    )


def _status(*workers: WorkerStatus, pending: int = 0) -> ManagerStatus:
    running = sum(w.running for w in workers)
    return ManagerStatus(
        workers=list(workers), pending=pending, running=running, finished=0, migrations=0, tokens_received=0
    )


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


def _finished(n: int, *workers: WorkerStatus) -> ManagerStatus:
    return ManagerStatus(workers=list(workers), pending=0, running=0, finished=n, migrations=0, tokens_received=0)


def test_chaos_paced_by_progress_rearms_after_samples_not_seconds_and_a_manager_restart_does_not_rewind_it(
    tmp_path: Path,
) -> None:
    """`--chaos-kill-every 1 --chaos-step-seconds 2` (16 samples a step): after a kill the next is armed once 8 more
    samples finished, however much wall time passes (a fast machine cannot outrun it, a slow one is not hit more
    often), and a restarted manager's count from 0 adds to the progress instead of taking it back.
    A real child process is the victim (SIGKILLed by the supervisor)."""
    sup = Supervisor(tmp_path / "logs")
    spot = SpotController(
        sup,
        plan=None,
        restarts=Restarts(sup, 0.0, start_child=lambda name: None, ready=lambda name: False),
        desired=0,
        chaos=ChaosMonkey(period_s=1.0),
        chaos_step_seconds=2.0,  # type: ignore[arg-type]
        samples_per_step=16,
    )
    try:
        sup.start("spot-0", [sys.executable, "-c", "import time; time.sleep(600)"], pool="spot")
        assert spot.hunting(now=0.0) and spot.wants_status(now=0.0)
        spot.tick(0.0, _finished(0, _worker("spot-0", 5)))  # caught streaming: killed
        assert [f.process for f in spot.faults] == ["spot-0"] and not sup.running()
        spot.tick(1e6, _finished(5))
        assert not spot.hunting(now=1e6)  # a million seconds later, but only 5 samples: not yet
        assert spot.wants_status(now=1e6)  # progress is read from the manager's status every tick
        spot.tick(1e6 + 1, _finished(3))  # a restarted manager: 3 more, 8 since the kill
        assert spot.samples_finished == 8 and spot.hunting(now=1e6 + 1)
    finally:
        sup.shutdown(grace_s=5)
