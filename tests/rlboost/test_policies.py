"""The manager's policies, directly (pure code, no network): placement, versions, balancing, migration, offload."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from rlboost.policies.balancing import BalanceWorker, HeldRequest, plan_rebalance
from rlboost.policies.migration import continuation, finish_reason_if_done
from rlboost.policies.offload import OffloadConfig, OffloadWindow, StepMeasurements
from rlboost.policies.placement import VersionView, WorkerLoad, place, version_moves
from rlboost.policies.spot_scaling import SpotScaler
from rlboost.wire.rollout_io import SamplingParams


def test_place_prefers_least_loaded_and_respects_capacity():
    workers = [WorkerLoad("a", 3, 4), WorkerLoad("b", 0, 2), WorkerLoad("c", 1, 8)]
    assert place(3, workers) == ["b", "c", "c"]  # b: 0/2 -> 1/2; c: 1/8 -> 2/8 -> 3/8 beat b's 1/2
    assert place(100, workers).count("a") == 1 and len(place(100, workers)) == 1 + 2 + 7
    assert place(5, []) == []


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), min_size=1, max_size=8), st.integers(0, 40))
def test_place_never_exceeds_free_capacity(loads, n):
    workers = [WorkerLoad(f"w{i}", min(r, c), c) for i, (r, c) in enumerate(loads)]
    picks = place(n, workers)
    assert len(picks) == min(n, sum(w.capacity - w.running for w in workers))
    for w in workers:
        assert w.running + picks.count(w.worker_id) <= w.capacity


def test_version_moves_once_and_never_strands_old_work():
    views = [VersionView("a", 0, -1), VersionView("b", 0, 1), VersionView("c", 1, -1)]
    assert version_moves(views, {1}, busy_versions={1}) == [("a", 1)]  # b already told, c already there
    assert version_moves(views, {1}, busy_versions={0, 1}) == []  # version-0 work still needs them
    assert version_moves(views, set(), busy_versions=set()) == []


def _held(n: int, tokens: int = 0, prefix: str = "r") -> list[HeldRequest]:
    return [HeldRequest(f"{prefix}{i}", tokens, float(i)) for i in range(n)]


def test_rebalance_moves_excess_to_idle_worker():
    plan = plan_rebalance([BalanceWorker("a", 4, _held(4)), BalanceWorker("b", 4, [])], pending=0)
    assert list(plan) == ["a"] and len(plan["a"]) == 2  # fair share of 4 over 8 slots: 2 each


def test_rebalance_is_conservative():
    assert plan_rebalance([BalanceWorker("a", 4, _held(4)), BalanceWorker("b", 4, [])], pending=1) == {}
    assert plan_rebalance([BalanceWorker("a", 4, _held(2)), BalanceWorker("b", 4, [])], pending=0) == {}  # excess 1
    assert plan_rebalance([BalanceWorker("a", 4, _held(4)), BalanceWorker("b", 4, _held(1, prefix="x"))], 0) == {}


def test_rebalance_moves_unstarted_then_longest_running_first():
    reqs = [
        HeldRequest("old", 50, 9.0),
        HeldRequest("new", 0, 0.1),
        HeldRequest("mid", 20, 5.0),
        HeldRequest("young", 10, 1.0),
    ]
    plan = plan_rebalance([BalanceWorker("a", 4, reqs), BalanceWorker("b", 4, [])], pending=0)
    assert plan == {"a": ["new", "old"]}


def test_migration_continuation_and_done_checks():
    assert continuation([1, 2], [3, 4]) == ([1, 2, 3, 4], 2)
    s = SamplingParams(max_new_tokens=3, stop_token_ids=(0,))
    assert finish_reason_if_done([5, 0], s) == "stop"
    assert finish_reason_if_done([5, 6, 7], s) == "length"
    assert finish_reason_if_done([5, 6], s) is None and finish_reason_if_done([], s) is None


def _synthetic_step(window_s: float, work: float, reserved_rate: float, spot_rate: float, train_s: float):
    """A step's bubble as a function of T: before T both pools generate; after T spot finishes the rest
    while the trainer waits; spot idles when the window leaves it nothing to do while training."""
    remaining = max(0.0, work - (reserved_rate + spot_rate) * window_s)
    trainer_wait = remaining / spot_rate
    spot_idle = max(0.0, train_s - trainer_wait) * 0.5 if remaining < work else 0.0
    return StepMeasurements(trainer_wait_s=trainer_wait, spot_idle_s=spot_idle)


def test_offload_window_converges_on_synthetic_workload():
    window = OffloadWindow(OffloadConfig(initial_s=2.0, min_s=0.1, max_s=100, gain=0.5))
    history = []
    for _ in range(60):
        window.start_step(now=0.0, spot_capacity=8, reserved_capacity=8)
        assert not window.should_offload(window.window_s * 0.99)
        assert window.should_offload(window.window_s)
        assert not window.should_offload(window.window_s + 1)  # once per step
        history.append(window.end_step(_synthetic_step(window.window_s, 100.0, 4.0, 4.0, 6.0)))
    # equilibrium: trainer_wait == spot_idle  <=>  (100 - 8T)/4 == (6 - (100 - 8T)/4)/2  <=>  T = 11.5
    assert abs(history[-1] - 11.5) < 0.05
    assert max(history[-10:]) - min(history[-10:]) < 0.01  # settled, not oscillating
    assert history[-1] > history[0]


def test_offload_collapses_to_reserved_only_without_spot():
    window = OffloadWindow(OffloadConfig(initial_s=1.0))
    window.start_step(now=0.0, spot_capacity=0, reserved_capacity=8)
    assert window.effective_window() == math.inf
    assert not window.should_offload(1e9)
    assert window.end_step(StepMeasurements(trainer_wait_s=50.0, spot_idle_s=0.0)) == 1.0  # nothing to adapt


def test_offload_window_stays_in_bounds():
    window = OffloadWindow(OffloadConfig(initial_s=1.0, min_s=0.5, max_s=3.0))
    for _ in range(10):
        window.start_step(0.0, 4, 4)
        window.end_step(StepMeasurements(trainer_wait_s=100.0, spot_idle_s=0.0))
    assert window.window_s == 3.0
    for _ in range(10):
        window.start_step(0.0, 4, 4)
        window.end_step(StepMeasurements(trainer_wait_s=0.0, spot_idle_s=100.0))
    assert window.window_s == 0.5


def test_spot_scaler_trims_idle_spot_and_grows_on_evidence():
    s = SpotScaler(limit=10, target_busy=0.7)
    assert s.cap(available=6) == 6
    assert s.update(used=6, busy_fraction=0.35, trainer_wait_s=10) == 3  # half as busy as wanted: half as many
    assert s.cap(available=6) == 3
    assert s.update(used=3, busy_fraction=0.95, trainer_wait_s=10) == 5  # the tail waited on a busy pool: grow
    assert s.update(used=5, busy_fraction=0.95, trainer_wait_s=0) == 5  # busy but nobody waited: hold
    assert s.update(used=5, busy_fraction=0.72, trainer_wait_s=10) == 5  # within tolerance
    assert s.update(used=1, busy_fraction=0.0, trainer_wait_s=0) == 1  # never below one while spot exists
    assert s.cap(available=0) == 0
