"""Fleet alone: free slots and busy seconds follow the requests a worker holds, version counts follow what workers
report, a silent worker is back once it speaks, and a drain notice marks matching workers once."""

from __future__ import annotations

import pytest

from rlboost.wire.rollout_io import Pool, WorkerRegistration
from rollout_manager.effects import Effects
from rollout_manager.fleet import Fleet


def _fleet(*workers: tuple[str, Pool, int]) -> Fleet:
    fleet = Fleet(Effects())
    for wid, pool, cap in workers:
        fleet.add(WorkerRegistration(wid, pool, node=f"node-{wid}", capacity=cap, weight_version=0), now=0.0)
    return fleet


def test_a_full_worker_leaves_the_free_ones_and_its_busy_spell_counts_per_pool():
    fleet = _fleet(("a", Pool.SPOT, 2), ("b", Pool.RESERVED, 1))
    a, b = fleet.workers["a"], fleet.workers["b"]
    fleet.hold(a, "r1", 1.0)
    fleet.hold(a, "r2", 2.0)
    fleet.hold(b, "r3", 2.0)
    assert fleet.free_workers() == [] and fleet.idle_slots(Pool.SPOT) == 0
    fleet.let_go(a, "r1", 3.0)
    assert fleet.free_workers() == [a] and fleet.busy_seconds(4.0) == {"reserved": 2.0, "spot": 3.0}
    fleet.let_go(a, "r2", 5.0)  # the spell ends: 4 s
    fleet.let_go(b, "r3", None)  # no clock (a cancelled step): not counted
    assert fleet.busy_seconds(None) == {"spot": 4.0}
    assert [w.id for w in fleet.free_workers()] == ["a", "b"]  # registration order


def test_versions_follow_reports_and_a_silent_worker_is_back_once_it_speaks():
    fleet = _fleet(("a", Pool.SPOT, 1), ("b", Pool.SPOT, 1))
    fleet.on_heartbeat("a", 2, now=1.0)
    assert fleet.versions == {0: 1, 2: 1} and fleet.effects.dirty
    fleet.effects.dirty = False
    fleet.workers["b"].expired = True
    assert fleet.capacity_by_pool() == {Pool.RESERVED: 0, Pool.SPOT: 1}
    fleet.on_weight_version("b", 0, now=2.0)
    assert not fleet.workers["b"].expired and fleet.effects.dirty and fleet.workers["b"].last_seen == 2.0
    removed = fleet.remove("b", now=3.0)
    assert removed is not None and "b" not in fleet.workers and fleet.versions[0] == 0
    assert fleet.remove("b", now=3.0) is None


def test_a_drain_notice_marks_matching_workers_and_sends_one_drain_command():
    fleet = _fleet(("a", Pool.SPOT, 1), ("b", Pool.SPOT, 1), ("c", Pool.SPOT, 1))
    assert fleet.drain("node-a", ["c"], "") == ["a", "c"]
    assert fleet.drain("node-a", [], "again") == ["a"]
    boxes = fleet.effects.take_outbox()
    assert {wid: box.drain for wid, box in boxes.items()} == {"a": "preemption", "c": "preemption"}
    fleet.set_pool_offloaded(Pool.SPOT, True)
    assert not fleet.schedulable(fleet.workers["b"]) and fleet.schedulable_at(0) == 0


@pytest.mark.parametrize("released", [True, False])
def test_a_released_worker_takes_nothing_until_its_heartbeat_says_resumed(released):
    fleet = _fleet(("a", Pool.RESERVED, 2))
    fleet.on_heartbeat("a", 0, now=1.0, memory_released=True)
    fleet.effects.dirty = False
    fleet.on_heartbeat("a", 0, now=2.0, memory_released=released)
    assert fleet.schedulable(fleet.workers["a"]) is not released and fleet.effects.dirty is not released
