"""Issue 17's pure policies: length-aware offload and the busy-spot scaler (property tests with hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.policies.length_offload import OffloadCandidate, longest_first, plan_offload
from rlboost.policies.placement import WorkerLoad
from rlboost.policies.spot_scaling import BusySpotScaler, SpotPrices, SpotSignals

PRICES = SpotPrices(reserved_per_hour=8 * 10.47, spot_per_instance_hour=2 * 2.66, reserved_gpus=8, gpus_per_instance=2)

candidates_st = st.lists(st.integers(0, 20_000), max_size=40).map(
    lambda toks: [OffloadCandidate(f"r{i}", t) for i, t in enumerate(toks)]
)
spot_st = st.lists(st.tuples(st.integers(0, 8), st.integers(1, 8)), max_size=6).map(
    lambda ws: [WorkerLoad(f"s{i}", min(r, c), c) for i, (r, c) in enumerate(ws)]
)


def test_offload_moves_the_longest_first_to_the_emptiest_spot_worker():
    cands = [OffloadCandidate("short", 10), OffloadCandidate("long", 5000), OffloadCandidate("mid", 900)]
    spot = [WorkerLoad("busy", 6, 8), WorkerLoad("empty", 0, 8)]
    plan = plan_offload(cands, spot)
    assert [rid for rid, _ in plan] == ["long", "mid", "short"]
    assert plan[0] == ("long", "empty")  # the longest into the smallest batch


@given(candidates_st, spot_st)
def test_offload_plan_covers_every_request_once_and_never_overfills(cands, spot):
    plan = plan_offload(cands, spot)
    assert sorted(rid for rid, _ in plan) == sorted(c.request_id for c in cands)
    free = {w.worker_id: w.capacity - w.running for w in spot}
    for wid in {w for _, w in plan if w is not None}:
        assert sum(1 for _, w in plan if w == wid) <= free[wid]
    placed = sum(1 for _, w in plan if w is not None)
    assert placed == min(len(cands), sum(free.values()))
    # requests left without a slot are the shortest ones
    order = [c.request_id for c in longest_first(cands)]
    assert [rid for rid, _ in plan] == order


def test_offload_spreads_the_tail_one_per_worker_first():
    cands = [OffloadCandidate(f"r{i}", 1000 - i) for i in range(4)]
    spot = [WorkerLoad(f"s{i}", 0, 8) for i in range(4)]
    assert sorted(w for _, w in plan_offload(cands, spot)) == ["s0", "s1", "s2", "s3"]


def test_offload_without_spot_moves_nothing():
    assert plan_offload([OffloadCandidate("a", 5)], []) == [("a", None)]


def test_busy_scaler_shrinks_idle_spot_and_grows_when_the_trainer_waits():
    scaler = BusySpotScaler(min_instances=1, max_instances=16, prices=PRICES)
    assert scaler.cap(10) == 10  # starts by using what exists
    assert scaler.update(SpotSignals(used=10, busy_fraction=0.1, trainer_wait_s=0.0, step_s=200)) < 10
    small = scaler.target
    assert scaler.update(SpotSignals(used=small, busy_fraction=0.9, trainer_wait_s=60.0, step_s=200)) > small


def test_busy_scaler_does_not_grow_when_nobody_waits_or_it_would_not_pay():
    scaler = BusySpotScaler(max_instances=16, prices=PRICES, target=4)
    assert scaler.update(SpotSignals(used=4, busy_fraction=0.95, trainer_wait_s=0.0, step_s=200)) == 4
    dear = SpotPrices(reserved_per_hour=10, spot_per_instance_hour=100, reserved_gpus=8, gpus_per_instance=2)
    scaler = BusySpotScaler(max_instances=16, prices=dear, target=4)
    assert scaler.update(SpotSignals(used=4, busy_fraction=0.95, trainer_wait_s=1.0, step_s=200)) == 4


@given(
    st.integers(0, 4),
    st.integers(0, 12),
    st.lists(st.tuples(st.integers(0, 20), st.floats(0, 1), st.floats(0, 300), st.floats(1, 600)), max_size=20),
)
def test_busy_scaler_stays_within_the_spec_bounds(lo, extra, steps):
    scaler = BusySpotScaler(min_instances=lo, max_instances=lo + extra, prices=PRICES)
    for used, busy, wait, step in steps:
        n = scaler.update(SpotSignals(used, busy, wait, step))
        assert lo <= n <= lo + extra
        assert 0 <= scaler.cap(used) <= min(used, lo + extra)


def test_break_even_busy_is_the_per_gpu_price_ratio():
    assert PRICES.break_even_busy() == pytest.approx(2.66 / 10.47)


def test_busy_scaler_rejects_inverted_bounds():
    with pytest.raises(ValueError, match="minReplicas"):
        BusySpotScaler(min_instances=3, max_instances=1)


def test_busy_scaler_keeps_its_target_when_fewer_instances_were_up():
    """A preemption or a thin market lowers `used`, not the evidence: the instances that come back are used."""
    scaler = BusySpotScaler(max_instances=16, prices=PRICES, target=10)
    assert scaler.update(SpotSignals(used=3, busy_fraction=0.9, trainer_wait_s=0.0, step_s=200)) == 10
    assert scaler.cap(12) == 10
