"""Speed-aware placement (rlboost.policies.placement.place_by_speed), directly: pure code, no network."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from rlboost.policies.placement import (
    WorkerLoad,
    WorkerSpeed,
    expected_remaining,
    place,
    place_by_speed,
    speed_bands,
)

worker_loads = st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6)), min_size=1, max_size=10)
lengths = st.lists(st.floats(1, 4096, allow_nan=False), min_size=0, max_size=40)
speeds = st.sampled_from([5.0, 20.0, 40.0, 80.0, 0.0])  # 0: not measured yet


def _workers(loads, rates=None, syncs=None) -> list[WorkerSpeed]:
    return [
        WorkerSpeed(f"w{i}", min(r, c), c, rates[i] if rates else 50.0, syncs[i] if syncs else 0.0)
        for i, (r, c) in enumerate(loads)
    ]


def test_long_request_goes_to_the_fast_worker_and_short_to_the_slow():
    workers = [WorkerSpeed("slow", 0, 4, 10.0), WorkerSpeed("fast", 0, 4, 80.0)]
    assert sorted(place_by_speed(2, [30.0, 900.0], workers)) == [(0, "slow"), (1, "fast")]
    assert sorted(place_by_speed(2, [900.0, 30.0], workers)) == [(0, "fast"), (1, "slow")]


def test_slow_workers_get_fewer_slots_but_every_slot_is_used_when_requests_remain():
    workers = [WorkerSpeed("slow", 0, 8, 10.0), WorkerSpeed("fast", 0, 8, 80.0)]
    few = place_by_speed(6, [100.0] * 6, workers)
    assert [w for _, w in few].count("fast") > [w for _, w in few].count("slow") >= 1
    many = place_by_speed(20, [100.0] * 20, workers)
    assert len(many) == 16  # both full: a slow slot beats a request left waiting


def test_a_far_worker_counts_as_slower_than_a_near_one_of_the_same_decode_speed():
    workers = [WorkerSpeed("near", 0, 4, 50.0, sync_s=1.0), WorkerSpeed("far", 0, 4, 50.0, sync_s=600.0)]
    assert speed_bands(workers, horizon_s=60.0) == [0, 5]  # 61/660 of the near one's tokens per step cycle
    assert sorted(place_by_speed(2, [10.0, 2000.0], workers)) == [(0, "far"), (1, "near")]


def test_unmeasured_workers_count_as_the_median_and_nothing_measured_is_least_loaded():
    assert speed_bands([WorkerSpeed("a", 0, 1), WorkerSpeed("b", 0, 1)], 10.0) == [0, 0]
    bands = speed_bands([WorkerSpeed("a", 0, 1, 10.0), WorkerSpeed("b", 0, 1), WorkerSpeed("c", 0, 1, 40.0)], 10.0)
    assert bands == [3, 0, 0]  # b counts as the median measured speed (of 10 and 40, the upper: 40)
    loads = [(0, 2), (1, 4)]
    assert place_by_speed(3, [5.0, 9.0, 1.0], _workers(loads, [0.0, 0.0])) == list(
        enumerate(place(3, [WorkerLoad(f"w{i}", r, c) for i, (r, c) in enumerate(loads)]))
    )


def test_expected_remaining_reads_long_runners_as_long_and_never_passes_the_budget():
    assert expected_remaining(0, 300.0, 1024) == 300.0  # fresh: the prior
    assert expected_remaining(100, 300.0, 1024) == 200.0  # under its prior: the rest of it
    assert expected_remaining(600, 300.0, 1024) == 424.0  # past it: as long again, capped by what is left
    assert expected_remaining(1024, 300.0, 1024) == 0.0
    assert expected_remaining(0, 0.0, 16) == 1.0


@given(worker_loads, lengths, st.integers(0, 50), st.floats(1, 500))
def test_equally_fast_workers_reduce_to_least_loaded_placement(loads, expected, n, rate):
    workers = _workers(loads, [rate] * len(loads))
    got = place_by_speed(n, expected, workers)
    want = place(min(n, len(expected)), [WorkerLoad(w.worker_id, w.running, w.capacity) for w in workers])
    assert got == list(enumerate(want))


@given(worker_loads, lengths, st.integers(0, 50), st.data())
def test_every_free_slot_is_used_while_requests_remain_and_none_twice(loads, expected, n, data):
    rates = data.draw(st.lists(speeds, min_size=len(loads), max_size=len(loads)))
    syncs = data.draw(st.lists(st.sampled_from([0.0, 5.0, 300.0]), min_size=len(loads), max_size=len(loads)))
    workers = _workers(loads, rates, syncs)
    got = place_by_speed(n, expected, workers)
    free = sum(w.capacity - w.running for w in workers)
    assert len(got) == min(n, len(expected), free)
    assert len({i for i, _ in got}) == len(got) and all(0 <= i < len(expected) for i, _ in got)
    for w in workers:
        assert w.running + sum(1 for _, wid in got if wid == w.worker_id) <= w.capacity


@given(worker_loads, lengths, st.data())
def test_faster_bands_get_the_longer_requests_when_the_window_is_all_placed(loads, expected, data):
    rates = data.draw(st.lists(speeds, min_size=len(loads), max_size=len(loads)))
    workers = _workers(loads, rates)  # no sync time: the bands do not depend on the horizon
    got = place_by_speed(len(expected), expected, workers)
    band = dict(zip((w.worker_id for w in workers), speed_bands(workers, 1.0), strict=True))
    placed = [(band[wid], expected[i]) for i, wid in got]
    if len(got) < len(expected) or len({b for b, _ in placed}) < 2:
        return  # some wait (the pairing picks from both ends), or one band: placed in queue order
    for b1, e1 in placed:
        assert all(e1 >= e2 for b2, e2 in placed if b1 < b2)


@given(worker_loads, lengths, st.integers(0, 50), st.data())
def test_deterministic_whatever_order_the_workers_come_in(loads, expected, n, data):
    rates = data.draw(st.lists(speeds, min_size=len(loads), max_size=len(loads)))
    workers = _workers(loads, rates)
    shuffled = list(workers)
    random.Random(data.draw(st.integers(0, 1000))).shuffle(shuffled)
    assert place_by_speed(n, expected, workers) == place_by_speed(n, expected, shuffled)
