"""Speed-aware rebalance (rlboost.policies.speed_rebalance.plan_speed_rebalance), directly: pure code, no network."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rlboost.policies.placement import WorkerSpeed
from rlboost.policies.speed_rebalance import RunningResponse, plan_speed_rebalance

rates = st.sampled_from([0.0, 5.0, 10.0, 20.0, 40.0, 41.0, 80.0])  # 0: not measured yet


@st.composite
def fleets(draw, rate=rates):
    """Workers (load, capacity, rate) and the responses they hold (expected remaining tokens)."""
    n = draw(st.integers(1, 8))
    workers, running = [], []
    for i in range(n):
        capacity = draw(st.integers(1, 6))
        held = draw(st.lists(st.floats(0, 5000, allow_nan=False), max_size=capacity))
        workers.append(WorkerSpeed(f"w{i}", len(held), capacity, draw(rate)))
        running += [RunningResponse(f"r{i}-{j}", f"w{i}", rem) for j, rem in enumerate(held)]
    return workers, running


def test_the_long_response_moves_from_the_slow_worker_to_the_fast_idle_one():
    workers = [WorkerSpeed("slow", 2, 8, 10.0), WorkerSpeed("fast", 0, 8, 40.0)]
    running = [RunningResponse("long", "slow", 2000.0), RunningResponse("short", "slow", 10.0)]
    assert plan_speed_rebalance(running, workers, pending=0) == [("long", "fast")]  # short: 0.25 s + 2 s > 1 s


def test_nothing_moves_while_requests_are_pending_or_past_the_bound():
    workers = [WorkerSpeed("slow", 3, 8, 10.0), WorkerSpeed("fast", 0, 8, 40.0)]
    running = [RunningResponse(f"r{i}", "slow", 1000.0 + i) for i in range(3)]
    assert plan_speed_rebalance(running, workers, pending=1) == []
    assert plan_speed_rebalance(running, workers, pending=0, max_moves=2) == [("r2", "fast"), ("r1", "fast")]


def test_moves_take_the_free_slots_and_the_fastest_first():
    workers = [WorkerSpeed("slow", 3, 3, 5.0), WorkerSpeed("mid", 1, 2, 20.0), WorkerSpeed("fast", 0, 1, 80.0)]
    running = [RunningResponse(f"r{i}", "slow", 100.0 * (i + 1)) for i in range(3)]
    assert plan_speed_rebalance(running, workers, pending=0) == [("r2", "fast"), ("r1", "mid")]


def test_unmeasured_workers_neither_give_nor_take():
    workers = [WorkerSpeed("new", 1, 4, 0.0), WorkerSpeed("fast", 0, 4, 40.0), WorkerSpeed("slow", 1, 4, 10.0)]
    running = [RunningResponse("a", "new", 3000.0), RunningResponse("b", "slow", 3000.0)]
    assert plan_speed_rebalance(running, workers, pending=0) == [("b", "fast")]
    assert plan_speed_rebalance([running[1]], [workers[0], workers[2]], pending=0) == []


@given(fleets(rate=st.just(40.0)), st.floats(0, 30))
def test_equally_fast_workers_move_nothing(fleet, cost):
    workers, running = fleet
    assert plan_speed_rebalance(running, workers, pending=0, migration_cost_s=cost) == []


@given(fleets(), st.floats(0, 30), st.integers(0, 20))
def test_a_move_goes_to_a_faster_worker_with_a_free_slot_and_beats_staying(fleet, cost, max_moves):
    workers, running = fleet
    by_id = {w.worker_id: w for w in workers}
    held = {r.request_id: r for r in running}
    moves = plan_speed_rebalance(running, workers, pending=0, migration_cost_s=cost, max_moves=max_moves)
    assert len(moves) <= max_moves and len({rid for rid, _ in moves}) == len(moves)
    for rid, target in moves:
        r, source, to = held[rid], by_id[held[rid].worker_id], by_id[target]
        assert source.tokens_per_s > 0 and to.tokens_per_s > source.tokens_per_s
        assert r.remaining / to.tokens_per_s + cost < r.remaining / source.tokens_per_s
    for w in workers:
        assert w.running + sum(1 for _, t in moves if t == w.worker_id) <= w.capacity


@given(fleets(), st.integers(1, 50))
def test_nothing_moves_while_anything_is_pending(fleet, pending):
    workers, running = fleet
    assert plan_speed_rebalance(running, workers, pending=pending, migration_cost_s=0.0) == []
