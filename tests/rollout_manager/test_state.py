"""The pure state machine (no network): leases, fencing, migration, drain, cancel, offloaded pools, released workers."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import (
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    WorkerRegistration,
)
from rlboost.wire.rollout_proto import status_from_pb, status_to_pb
from rollout_manager import book as book_module
from rollout_manager.state import ManagerState, StepError


def _state(*workers: tuple[str, int], pool: Pool = Pool.SPOT) -> ManagerState:
    st = ManagerState(lease_timeout_s=1.0)
    for wid, cap in workers:
        st.register(WorkerRegistration(wid, pool, node=f"node-{wid}", capacity=cap, weight_version=0), now=0.0)
    return st


def _step(st: ManagerState, step: int = 0, prompts: int = 1, group: int = 1, budget: int = 4, now: float = 0.0) -> int:
    r = RolloutRequest(
        step,
        0,
        [PromptItem(i, [9, 9]) for i in range(prompts)],
        group,
        SamplingParams(temperature=0.0, max_new_tokens=budget, seed=1, stop_token_ids=(0,)),
    )
    return st.add_step(r, now)


def _chunk(rid: str, epoch: int, offset: int, tokens: list[int], finished: bool = False, reason: str = ""):
    return TokenChunk(rid, epoch, offset, tokens, [0.0] * len(tokens), finished, reason)


def test_assign_least_loaded_and_batch_per_worker():
    st = _state(("a", 2), ("b", 2))
    assert _step(st, group=3) == 3
    assert st.schedule(0.0) == 3
    out = st.take_outbox()
    assert sorted(len(box.assign) for box in out.values()) == [1, 2]
    assert st.pending == 0 and st.running == 3


def test_stale_epoch_and_foreign_worker_chunks_are_discarded():
    st = _state(("a", 1), ("b", 1))
    _step(st)
    st.schedule(0.0)
    ((wid, box),) = st.take_outbox().items()
    a = box.assign[0]
    st.on_chunks(wid, [_chunk(a.request_id, a.lease_epoch, 0, [1])], 0.1)
    other = "b" if wid == "a" else "a"
    st.on_chunks(other, [_chunk(a.request_id, a.lease_epoch, 1, [2])], 0.1)  # not its lease
    st.on_chunks(wid, [_chunk(a.request_id, a.lease_epoch - 1, 1, [2])], 0.1)  # old epoch
    assert list(st.requests[a.request_id].tokens) == [1]


def test_lease_expiry_migrates_with_tokens_and_worker_returns_when_it_speaks():
    st = _state(("a", 1))
    _step(st)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    st.on_chunks("a", [_chunk(a.request_id, 1, 0, [5, 6])], 0.5)
    st.tick(1.4)
    assert st.running == 1  # 0.9 s silent: lease still held
    st.tick(1.6)
    assert st.pending == 1 and st.tally.migrations == 1 and st.workers["a"].expired
    assert st.take_outbox()["a"].revoke == {"lease_expired": [a.request_id]}
    st.schedule(1.6)
    assert st.take_outbox() == {}  # expired worker gets nothing
    st.on_heartbeat("a", 0, 1.7)
    st.schedule(1.7)
    again = st.take_outbox()["a"].assign[0]
    assert again.input_ids == [9, 9, 5, 6] and again.prompt_len == 2 and again.lease_epoch == 2


def test_migration_with_spent_budget_finishes_without_a_worker():
    st = _state(("a", 1))
    _step(st, budget=2)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    st.on_chunks("a", [_chunk(a.request_id, 1, 0, [3, 4])], 0.1)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 0.2)
    (traj,) = st.take_delivered()
    assert list(traj.response_ids) == [3, 4] and traj.finish_reason == "length" and traj.workers == ["a"]


def test_over_budget_chunk_is_cut_and_finishes():
    st = _state(("a", 1))
    _step(st, budget=2)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    st.on_chunks("a", [_chunk(a.request_id, 1, 0, [3, 4, 5])], 0.1)
    (traj,) = st.take_delivered()
    assert list(traj.response_ids) == [3, 4] and len(traj.logprobs) == 2


def test_drain_by_node_stops_new_work_and_migrates_on_stream_end():
    st = _state(("a", 1), ("b", 1))
    _step(st, group=2)
    st.schedule(0.0)
    boxes = st.take_outbox()
    ra = boxes["a"].assign[0].request_id
    assert st.drain("node-a", [], "spot-itn") == ["a"]
    assert st.take_outbox()["a"].drain == "spot-itn"
    st.on_chunks("a", [_chunk(ra, 1, 0, [7])], 0.1)
    assert st.remove_worker("a", MigrationReason.STREAM_BROKEN, 0.2) == 1
    assert st.pending == 1 and list(st.requests[ra].tokens) == [7]


def test_cancel_step_drops_pending_and_revokes_running():
    st = _state(("a", 1))
    _step(st, group=3)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    assert st.cancel_step(0) == 3
    assert st.take_outbox()["a"].revoke == {"cancelled": [a.request_id]}
    assert (st.pending, st.running, len(st.requests)) == (0, 0, 0)
    st.on_chunks("a", [_chunk(a.request_id, 1, 0, [1])], 0.1)  # late chunk of a cancelled request: ignored
    assert st.take_delivered() == []


def test_duplicate_step_and_prompt_index_are_rejected():
    st = _state()
    _step(st)
    with pytest.raises(StepError, match="rollout.step"):
        _step(st)
    r = RolloutRequest(1, 0, [PromptItem(0, [1]), PromptItem(0, [2])], 1, SamplingParams())
    with pytest.raises(StepError, match="prompt_index"):
        st.add_step(r, 0.0)


def test_revoke_waits_for_flush_then_deadline_fences():
    st = _state(("a", 2))
    _step(st)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    assert st.revoke(a.request_id, MigrationReason.OFFLOAD, 0.1)
    st.on_heartbeat("a", 0, 0.5)
    st.tick(0.5)
    assert st.running == 1  # still waiting for the worker's flush
    st.on_heartbeat("a", 0, 1.2)
    st.tick(1.2)  # revoke deadline (1 s) passed without a flush: migrate anyway
    assert st.pending == 1 and st.tally.migrations == 1


def test_offloaded_reserved_pool_gets_no_work():
    st = _state(("r", 4), pool=Pool.RESERVED)
    st.set_pool_offloaded(Pool.RESERVED, True)
    _step(st)
    assert st.schedule(0.0) == 0
    st.set_pool_offloaded(Pool.RESERVED, False)
    assert st.schedule(0.0) == 1


def memory_released_gauge() -> float | None:
    return REGISTRY.get_sample_value("rlboost_manager_workers_memory_released", {"pool": "spot"})


def test_a_released_worker_gets_no_work_until_its_heartbeat_says_resumed():
    """Colocation: a reserved worker whose memory is released for training keeps its lease (heartbeats) but is
    assigned nothing; the work goes to the others, and it takes work again as soon as its heartbeat says resumed."""
    st = _state(("reserved", 2), ("spot", 1))
    st.on_heartbeat("reserved", 0, 0.1, memory_released=True)
    _step(st, group=3)
    st.schedule(0.2)
    boxes = st.take_outbox()
    assert "reserved" not in boxes and len(boxes["spot"].assign) == 1 and st.pending == 2
    assert [w.memory_released for w in st.status().workers] == [True, False]
    st.tick(0.3)
    assert memory_released_gauge() == 1  # on /metrics too (_state registers spot workers)
    st.on_heartbeat("reserved", 0, 0.5, memory_released=True)  # still released: still nothing, lease kept
    st.schedule(0.6)
    assert "reserved" not in st.take_outbox() and "reserved" in st.workers
    st.on_heartbeat("reserved", 0, 0.7, memory_released=False)
    assert st.dirty
    st.tick(0.7)
    assert memory_released_gauge() == 0
    st.schedule(0.8)
    assert len(st.take_outbox()["reserved"].assign) == 2 and st.pending == 0


def test_status_counts_only_the_tokens_a_worker_streamed_of_responses_it_still_runs():
    """`inflight_tokens` (what chaos waits for): tokens the current worker streamed, not those it inherited with a
    migrated request, and nothing once the response finished."""
    st = _state(("a", 1))
    _step(st, budget=8)
    st.schedule(0.0)
    (a,) = st.take_outbox()["a"].assign
    inflight = lambda: {w.worker_id: w.inflight_tokens for w in st.status().workers}  # noqa: E731
    assert inflight() == {"a": 0}  # assigned, nothing streamed yet
    st.on_chunks("a", [_chunk(a.request_id, a.lease_epoch, 0, [1, 2, 3])], 0.1)
    assert inflight() == {"a": 3}
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 0.2)  # killed: 3 tokens kept, request pending again
    st.register(WorkerRegistration("b", Pool.SPOT, node="node-b", capacity=1, weight_version=0), now=0.3)
    st.schedule(0.3)
    (b,) = st.take_outbox()["b"].assign
    assert inflight() == {"b": 0}  # inherited 3 tokens, streamed none of its own yet
    st.on_chunks("b", [_chunk(b.request_id, b.lease_epoch, 3, [4])], 0.4)
    assert inflight() == {"b": 1}
    st.on_chunks("b", [_chunk(b.request_id, b.lease_epoch, 4, [0], finished=True, reason="stop")], 0.5)
    assert inflight() == {"b": 0}


def _manager_counter(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_status_counts_lost_and_regenerated_tokens_and_migrations_by_reason_like_the_metrics():
    st = _state(("a", 1))
    _step(st, budget=8)
    st.schedule(0.0)
    a = st.take_outbox()["a"].assign[0]
    before = [_manager_counter(f"rlboost_manager_tokens_{n}_total") for n in ("lost", "regenerated")]
    revoked_before = _manager_counter("rlboost_manager_migrations_total", {"reason": "revoked"})
    st.on_chunks("a", [_chunk(a.request_id, a.lease_epoch, 0, [1, 2])], 0.1)
    st.on_chunks("a", [_chunk(a.request_id, a.lease_epoch, 1, [7, 8, 9])], 0.2)  # position 1 made again: 1 regenerated
    st.on_chunks("a", [_chunk(a.request_id, a.lease_epoch, 5, [3], finished=True, reason="stop")], 0.3)  # a gap
    status = st.status()
    assert (status.tokens_received, status.tokens_lost, status.tokens_regenerated) == (2, 4, 1)
    assert status.migrations == 1 and status.migrations_by_reason == {"revoked": 1}
    after = [_manager_counter(f"rlboost_manager_tokens_{n}_total") for n in ("lost", "regenerated")]
    assert [x - y for x, y in zip(after, before, strict=True)] == [4, 1]
    assert _manager_counter("rlboost_manager_migrations_total", {"reason": "revoked"}) - revoked_before == 1


def test_busy_seconds_count_time_a_worker_holds_a_request_per_pool():
    st = _state(("a", 2), ("b", 2))
    _step(st, group=2, budget=2)
    st.schedule(1.0)  # both on one worker or one each: each held worker is busy from 1.0
    boxes = st.take_outbox()
    assert st.status(1.5).busy_seconds["spot"] == pytest.approx(0.5 * len(boxes))  # open spells count up to now
    for wid, box in boxes.items():
        for a in box.assign:
            st.on_chunks(wid, [_chunk(a.request_id, a.lease_epoch, 0, [1, 0], finished=True, reason="stop")], 3.0)
    busy = st.status(10.0).busy_seconds
    assert busy["spot"] == pytest.approx(2.0 * len(boxes)) and busy["reserved"] == 0.0  # idle after 3.0: not counted
    for wid in ("a", "b"):
        st.remove_worker(wid, MigrationReason.STREAM_BROKEN, 10.0)
    st.register(WorkerRegistration("r", Pool.RESERVED, node="n", capacity=1, weight_version=0), now=10.0)
    _step(st, step=1, budget=4)
    st.schedule(10.0)
    st.remove_worker("r", MigrationReason.STREAM_BROKEN, 12.5)  # a worker that leaves takes no busy time with it
    assert st.status(20.0).busy_seconds == pytest.approx({"reserved": 2.5, "spot": 2.0 * len(boxes)})
    status = st.status(20.0)
    assert status_from_pb(status_to_pb(status)).busy_seconds == status.busy_seconds  # GetStatus carries them


def test_a_step_cancelled_while_pending_and_re_attached_places_each_request_once():
    """Found by the all-services chaos run: the trainer was SIGKILLed while its step's requests were still pending
    (cancel_step leaves their ids in the pending queue), came back and sent the same step (the same request ids).
    Speed-aware placement read the old and the new queue entry as two pending requests and assigned the request to
    two workers: one kept an id no request had any more, GetStatus failed on it from then on, and the job hung."""
    st = _state(("a", 8), ("b", 8))
    _step(st, step=0, prompts=2, budget=32)
    st.schedule(0.0)
    for wid, box in st.take_outbox().items():  # measured rates, "b" 8x slower: speed-aware placement pairs by length
        (a,) = box.assign
        done = _chunk(a.request_id, a.lease_epoch, 0, [5] * 16, finished=True, reason="stop")
        st.on_chunks(wid, [done], 1.0 if wid == "a" else 8.0)
    assert st.workers["a"].tokens_per_s > st.workers["b"].tokens_per_s > 0
    for w in st.workers.values():
        w.running.update(f"busy-{w.id}-{i}" for i in range(8))  # no free slot: step 1 stays pending
        st.fleet.free.pop(w.id, None)
    _step(st, step=1, prompts=4, budget=32, now=8.0)
    assert st.cancel_step(1, 8.5) == 4  # the trainer died: its pending requests are dropped
    for w in st.workers.values():
        w.running.clear()
        st.fleet.free[w.id] = None
    _step(st, step=1, prompts=4, budget=32, now=9.0)  # the restarted trainer: the same step, the same ids
    for rid in ("s1-p0-g0", "s1-p1-g0"):  # expected shorter than the rest (as adopted held responses are): the slow
        st.requests[rid].tokens, st.requests[rid].logprobs = [5] * 24, [0.0] * 24  # worker's slots take them

    assert st.schedule(9.0) == 4
    sent = [a.request_id for box in st.take_outbox().values() for a in box.assign]
    assert sorted(sent) == sorted(st.requests), sent  # each request sent to one worker, once
    held = [rid for w in st.workers.values() for rid in w.running]
    assert sorted(held) == sorted(set(held)) and set(held) == set(st.requests), held
    assert all(st.requests[rid].worker == w.id for w in st.workers.values() for rid in w.running)
    assert st.status(9.0).running == 4  # GetStatus works


def test_a_late_chunk_of_a_cancelled_step_does_not_pass_as_the_re_sent_steps():
    """The trainer died mid-step and came back with the same step (the same request ids), which went to the same
    worker: the new lease's epoch follows the dropped one's, so the old run's late chunk is stale."""
    st = _state(("a", 4))
    _step(st, budget=8)
    st.schedule(0.0)
    (old,) = st.take_outbox()["a"].assign
    st.cancel_step(0, 0.5)
    _step(st, budget=8, now=1.0)
    st.schedule(1.0)
    (new,) = st.take_outbox()["a"].assign
    assert new.request_id == old.request_id and new.lease_epoch > old.lease_epoch
    st.on_chunks("a", [_chunk(old.request_id, old.lease_epoch, 0, [5, 6])], 1.1)  # the cancelled run's flush
    assert list(st.requests[new.request_id].tokens) == [] and st.tally.tokens_received == 0


def test_the_epochs_of_cancelled_steps_are_bounded_and_the_newest_kept(monkeypatch):
    """Cancelled steps that are never sent again leave at most MAX_DROPPED_EPOCHS epochs behind, forgetting the
    oldest; the step cancelled last, sent again, still continues its leases."""
    monkeypatch.setattr(book_module, "MAX_DROPPED_EPOCHS", 6)
    st = _state(("a", 4))
    for step in range(3):  # three steps of 4 requests, each leased once, then cancelled: 12 drops
        _step(st, step=step, prompts=4, budget=8, now=step)
        st.schedule(step)
        st.take_outbox()
        st.cancel_step(step, step + 0.5)
    epochs = st.book.dropped_epochs
    assert len(epochs) == 6 and all(rid.startswith("s2-") for rid in list(epochs)[2:])
    _step(st, step=2, prompts=4, budget=8, now=9.0)  # the last step sent again: its leases go on
    assert all(st.requests[rid].lease_epoch == 1 for rid in st.requests)
    st.schedule(9.0)
    assert all(a.lease_epoch == 2 for a in st.take_outbox()["a"].assign)


def test_the_speed_rebalance_knobs_come_from_the_job_spec():
    """rollout.speedRebalanceMigrationCostS / speedRebalanceMaxMoves reach the manager's rebalance (0 moves: off);
    the defaults are the policy's own (rlboost.policies.speed_rebalance)."""
    from rlboost.policies.speed_rebalance import MAX_MOVES, MIGRATION_COST_S
    from rlboost.spec import RolloutSpec
    from rollout_manager.steps import RequestPolicy

    spec = RolloutSpec.model_validate({"speedRebalanceMigrationCostS": 30, "speedRebalanceMaxMoves": 0})
    st = ManagerState(lease_timeout_s=5, policy=RequestPolicy.from_spec(spec))
    assert (st.speed.migration_cost_s, st.speed.rebalance_moves) == (30, 0)
    default = ManagerState(lease_timeout_s=5, policy=RequestPolicy.from_spec(RolloutSpec()))
    assert (default.speed.migration_cost_s, default.speed.rebalance_moves) == (MIGRATION_COST_S, MAX_MOVES)
    with pytest.raises(ValueError, match="speedRebalanceMaxMoves"):
        RolloutSpec.model_validate({"speedRebalanceMaxMoves": -1})
