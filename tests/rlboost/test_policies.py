"""Shared scheduling policies: placement, offload window, spot scaling (pure, no network)."""

from __future__ import annotations

from rlboost.policies.offload import OffloadWindow
from rlboost.policies.placement import WorkerLoad, choose_worker, place_many
from rlboost.policies.spot_scaling import SpotScaler


def workers() -> list[WorkerLoad]:
    return [
        WorkerLoad("a", running=3, capacity=4, weight_version=1),
        WorkerLoad("b", running=1, capacity=4, weight_version=1),
        WorkerLoad("c", running=0, capacity=4, weight_version=0),  # stale version
        WorkerLoad("d", running=0, capacity=4, weight_version=1, draining=True),
    ]


def test_choose_least_loaded_holding_the_version():
    assert choose_worker(workers(), 1).worker_id == "b"
    assert choose_worker(workers(), 0).worker_id == "c"
    assert choose_worker(workers(), 2) is None


def test_place_many_matches_repeated_choice_and_respects_capacity():
    ws = workers()
    chosen = [w.worker_id for w in place_many(ws, 1, 10)]
    # b (0.25 -> 0.5), b (0.5 < 0.75), then a tie at 0.75 goes to the smaller id, then b; then all full
    assert chosen == ["b", "b", "a", "b"]
    assert all(w.running <= w.capacity for w in ws)


def test_offload_window_adapts_both_ways_and_stays_in_bounds():
    w = OffloadWindow(window_s=100, min_s=5, max_s=200)
    assert w.update(trainer_wait_s=60, spot_idle_s=0) == 120  # trainer waited for the tail: offload later
    assert w.update(trainer_wait_s=0, spot_idle_s=90) == 90  # spot idle: offload earlier
    for _ in range(50):
        w.update(0, 1000)
    assert w.window_s == 5
    assert w.update(0.5, 0) == 5  # inside the dead band


def test_offload_window_never_offloads_without_spot():
    w = OffloadWindow(window_s=10)
    assert w.window(spot_workers=0) is None
    assert not w.should_offload(elapsed_s=1e9, spot_workers=0)
    assert w.should_offload(elapsed_s=10, spot_workers=1)


def test_offload_window_converges_on_a_synthetic_workload():
    """Trainer wait falls and spot idle rises linearly in T: T settles where they balance (T*=60)."""
    w = OffloadWindow(window_s=150, min_s=5, max_s=600)
    for _ in range(40):
        t = w.window_s
        w.update(trainer_wait_s=max(0.0, 120 - t), spot_idle_s=max(0.0, t - 60) * 2)
    assert abs(w.window_s - 80) < 3  # 120 - T = 2 (T - 60)  =>  T = 80


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
