"""What a preemption costs, counted by the manager's state machine (preemption_costs.py): real Request and Worker
records driven through ManagerState (no network, no stand-ins), for a notice drain (the worker's SIGTERM, and a
NATS notice) and for a silent death (its stream broke, or its lease expired). Clock values are given, not read."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import Pool, PromptItem, RolloutRequest, SamplingParams, TokenChunk, WorkerRegistration
from rollout_manager.state import ManagerState

BUDGET = 20
RATE = 10.0  # tokens/s the worker decoded its first request at (10 tokens in 1 s)


def _chunk(rid: str, epoch: int, offset: int, n: int, finished: bool = False, reason: str = "") -> TokenChunk:
    return TokenChunk(rid, epoch, offset, [7] * n, [-0.5] * n, finished, reason)


def _state() -> ManagerState:
    """One spot worker `a` that decoded a first request at RATE, holding a second one; `b` registers later."""
    st = ManagerState(lease_timeout_s=1.0)
    st.register(WorkerRegistration("a", Pool.SPOT, node="node-a", capacity=1, weight_version=0), now=0.0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=BUDGET, seed=1, stop_token_ids=(0,))
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [9, 9]), PromptItem(1, [9, 9])], 1, sampling), 0.0)
    st.schedule(0.0)
    first = st.take_outbox()["a"].assign[0]
    st.on_chunks("a", [_chunk(first.request_id, first.lease_epoch, 0, 10)], 0.5)
    st.on_chunks("a", [_chunk(first.request_id, first.lease_epoch, 10, 10, finished=True, reason="length")], 1.0)
    assert st.workers["a"].tokens_per_s == pytest.approx(2 * RATE)  # 20 tokens in 1 s
    return st


def _second(st: ManagerState, at: float) -> tuple[str, int]:
    """Assign the second request to `a` at `at`; (its id, lease epoch)."""
    st.schedule(at)
    a = st.take_outbox()["a"].assign[0]
    return a.request_id, a.lease_epoch


def _resume_on_b(st: ManagerState, rid: str, held: int, at: float, token_at: float) -> None:
    """`b` joins at `at`, takes the moved request and streams its next token at `token_at`."""
    st.register(WorkerRegistration("b", Pool.SPOT, node="node-b", capacity=1, weight_version=0), now=at)
    st.schedule(at)
    b = st.take_outbox()["b"].assign[0]
    assert b.request_id == rid and b.generated == held  # it continues from every token kept
    st.on_chunks("b", [_chunk(rid, b.lease_epoch, held, 1)], token_at)


def _costs(caplog: pytest.LogCaptureFixture, msg: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == msg]


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_notice_drain_counts_drain_time_in_flight_kept_and_no_loss(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    notices = _metric("rlboost_manager_preemptions_total", kind="notice")
    lost = _metric("rlboost_manager_preempted_tokens_total", kind="notice", what="lost")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 3)], 1.2)
    st.on_drain_notice("a", 1.5)  # its SIGTERM: 3 tokens streamed so far
    st.drain("", ["a"], "spot-itn", now=1.6)  # a NATS notice for the same worker: the same preemption
    st.on_chunks("a", [_chunk(rid, epoch, 3, 2, finished=True, reason="abort")], 1.75)  # the flush: 2 more
    (cost,) = _costs(caplog, "preemption cost")
    assert (cost.kind, cost.notice_to_drained_s, cost.detected_after_s) == ("notice", 0.25, None)
    assert (cost.tokens_streamed, cost.tokens_in_flight, cost.tokens_kept, cost.tokens_lost) == (3, 5, 5, 0)
    assert cost.request_ids == [rid]
    assert _metric("rlboost_manager_preemptions_total", kind="notice") == notices + 1
    assert _metric("rlboost_manager_preempted_tokens_total", kind="notice", what="lost") == lost
    _resume_on_b(st, rid, held=5, at=2.0, token_at=2.25)
    (resumed,) = _costs(caplog, "moved request resumed")
    assert (resumed.reason, resumed.resume_s, resumed.stalled_s) == ("drained", 0.5, 0.5)
    assert list(st.requests[rid].tokens) == [7] * 6


def test_idle_workers_preemptions_cost_nothing_and_are_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Like a silent death of an idle worker (no request to hand back), a notice to one is no preemption's cost: the
    job's end (every worker gets SIGTERM) would otherwise count as preemptions."""
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    notices = _metric("rlboost_manager_preemptions_total", kind="notice")
    st = _state()
    assert st.drain("node-a", [], "spot-itn", now=2.0) == ["a"]
    assert _costs(caplog, "preemption notice received") and not _costs(caplog, "preemption cost")
    st.register(WorkerRegistration("b", Pool.SPOT, node="node-b", capacity=1, weight_version=0), now=2.0)
    st.remove_worker("b", MigrationReason.STREAM_BROKEN, 2.5)
    assert not _costs(caplog, "preemption cost")
    assert _metric("rlboost_manager_preemptions_total", kind="notice") == notices


def test_silent_death_stream_broken_counts_lost_tokens_from_the_decode_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    silent = _metric("rlboost_manager_preemptions_total", kind="silent")
    lost = _metric("rlboost_manager_preempted_tokens_total", kind="silent", what="lost")
    stalled = _metric("rlboost_manager_preemption_stalled_request_seconds_total")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 4)], 1.2)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.4)  # SIGKILL: its stream broke 0.2 s after its last chunk
    (cost,) = _costs(caplog, "preemption cost")
    assert (cost.kind, cost.notice_to_drained_s, cost.detected_after_s) == ("silent", None, 0.2)
    # 20 tokens/s x 0.2 s since its last chunk: 4 generated and never received, regenerated by the next worker
    assert (cost.tokens_streamed, cost.tokens_in_flight, cost.tokens_kept, cost.tokens_lost) == (4, 8, 4, 4)
    assert _metric("rlboost_manager_preemptions_total", kind="silent") == silent + 1
    assert _metric("rlboost_manager_preempted_tokens_total", kind="silent", what="lost") == lost + 4
    _resume_on_b(st, rid, held=4, at=1.5, token_at=1.7)
    (resumed,) = _costs(caplog, "moved request resumed")
    assert (resumed.reason, resumed.resume_s, resumed.stalled_s) == ("stream_broken", 0.3, 0.5)
    assert _metric("rlboost_manager_preemption_stalled_request_seconds_total") == pytest.approx(stalled + 0.5)


@pytest.mark.parametrize(("bounds", "lost"), [((16, 0.05), 1), ((3, 10.0), 3), ((0, 0.0), 8)])
def test_a_deaths_loss_is_capped_by_the_chunk_cadence(
    caplog: pytest.LogCaptureFixture, bounds: tuple[int, float], lost: int
) -> None:
    """A worker sends a chunk every `chunk_max_tokens` tokens or `chunk_max_ms`: no more of a response is unsent
    (20 tokens/s x 0.4 s since its last chunk = 8 uncapped; 50 ms: 1; 3 tokens: 3)."""
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 4)], 1.2)
    st.lifecycle.costs.flush_bounds = bounds  # what the server sets from its chunk cadence
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.6)
    (cost,) = _costs(caplog, "preemption cost")
    assert cost.tokens_lost == lost


def test_a_workers_first_request_estimates_the_loss_at_its_own_rate(caplog: pytest.LogCaptureFixture) -> None:
    """No request has left the worker yet, so it has no measured rate: the request's own (6 tokens in 0.3 s)."""
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    st = ManagerState(lease_timeout_s=1.0)
    st.register(WorkerRegistration("a", Pool.SPOT, node="node-a", capacity=1, weight_version=0), now=0.0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=BUDGET, seed=1, stop_token_ids=(0,))
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [9, 9])], 1, sampling), 0.0)
    rid, epoch = _second(st, 0.1)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 6)], 0.4)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 0.6)
    (cost,) = _costs(caplog, "preemption cost")
    assert st.workers == {} and cost.tokens_lost == 4  # 20 tokens/s x 0.2 s


def test_silent_death_lease_expiry_is_detected_after_the_lease_and_caps_the_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 6)], 1.2)
    st.tick(2.1)
    assert not _costs(caplog, "preemption cost")  # 0.9 s silent: its lease (1 s) still holds
    st.tick(2.5)  # 1.3 s silent: the lease expired
    (cost,) = _costs(caplog, "preemption cost")
    assert (cost.kind, cost.detected_after_s, cost.tokens_streamed, cost.tokens_kept) == ("expired", 1.3, 6, 6)
    assert cost.tokens_lost == BUDGET - 6  # 20 tokens/s x 1.3 s, capped by what the response may still add
    assert cost.tokens_in_flight == BUDGET
    st.on_heartbeat("a", 0, 2.6)  # a zombie, not dead: it speaks again, takes the request back and goes on
    st.schedule(2.6)
    again = st.take_outbox()["a"].assign[0]
    st.on_chunks("a", [_chunk(rid, again.lease_epoch, 6, 1)], 2.9)
    (resumed,) = _costs(caplog, "moved request resumed")
    assert (resumed.reason, resumed.resume_s, resumed.stalled_s) == ("lease_expired", 0.4, 1.7)
    assert len(_costs(caplog, "preemption cost")) == 1


def test_a_migration_that_is_no_preemption_costs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rollout_manager.state")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 3)], 1.2)
    assert st.revoke(rid, MigrationReason.REBALANCE, 1.3)
    st.on_chunks("a", [_chunk(rid, epoch, 3, 1, finished=True, reason="abort")], 1.4)
    assert not _costs(caplog, "preemption cost") and not st.lifecycle.costs.moved


def test_a_cancelled_step_forgets_its_moved_requests() -> None:
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 3)], 1.2)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.3)
    assert rid in st.lifecycle.costs.moved
    st.cancel_step(0, 1.4)
    assert not st.lifecycle.costs.moved


def _histogram(name: str, kind: str) -> tuple[float, float]:
    """(count, sum) of a per-preemption histogram of `kind`."""
    return _metric(f"{name}_count", kind=kind), _metric(f"{name}_sum", kind=kind)


def test_each_preemption_is_observed_in_histograms_by_kind() -> None:
    in_flight = _histogram("rlboost_manager_preemption_tokens_in_flight", "silent")
    regenerated = _histogram("rlboost_manager_preemption_tokens_regenerated", "silent")
    detected = _histogram("rlboost_manager_preemption_detected_after_seconds", "silent")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 4)], 1.2)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.4)  # 4 streamed, 4 estimated lost (as above)
    assert _histogram("rlboost_manager_preemption_tokens_in_flight", "silent") == (in_flight[0] + 1, in_flight[1] + 8)
    assert _histogram("rlboost_manager_preemption_tokens_regenerated", "silent") == (
        regenerated[0] + 1,
        regenerated[1] + 4,
    )
    count, total = _histogram("rlboost_manager_preemption_detected_after_seconds", "silent")
    assert (count, total) == (detected[0] + 1, pytest.approx(detected[1] + 0.2))


def test_an_expired_lease_is_its_own_kind_in_the_metrics() -> None:
    expired = _metric("rlboost_manager_preemptions_total", kind="expired")
    silent = _metric("rlboost_manager_preemptions_total", kind="silent")
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 6)], 1.2)
    st.tick(2.5)  # 1.3 s silent: the lease (1 s) expired
    assert _metric("rlboost_manager_preemptions_total", kind="expired") == expired + 1
    assert _metric("rlboost_manager_preemptions_total", kind="silent") == silent
    count, total = _histogram("rlboost_manager_preemption_detected_after_seconds", "expired")
    assert count >= 1 and total >= 1.3


def test_status_carries_the_slot_seconds_lost_and_held_as_they_accrue() -> None:
    """The status the trainer reads after each step: preempted slot-seconds grow while a moved request waits (its
    stall counted up to the read), stop at its next token; the fleet's slot-seconds are capacity x time."""
    st = _state()  # `a` (capacity 1) registered at 0
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 4)], 1.2)
    before = st.status(1.2)
    assert (before.preemptions, before.preempted_slot_seconds, before.slot_seconds) == (0, 0.0, pytest.approx(1.2))
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.4)
    waiting = st.status(1.5)  # stalled since its last token at 1.2; no worker holds a slot now
    assert waiting.preemptions == 1
    assert (waiting.preempted_slot_seconds, waiting.slot_seconds) == (pytest.approx(0.3), pytest.approx(1.4))
    _resume_on_b(st, rid, held=4, at=1.6, token_at=1.7)  # `b` (capacity 1) from 1.6; the next token at 1.7
    after = st.status(3.0)
    assert (after.preempted_slot_seconds, after.slot_seconds) == (pytest.approx(0.5), pytest.approx(1.4 + 1.4))


def test_a_moved_request_that_never_resumes_keeps_its_stall_counted() -> None:
    st = _state()
    rid, epoch = _second(st, 1.0)
    st.on_chunks("a", [_chunk(rid, epoch, 0, 3)], 1.2)
    st.remove_worker("a", MigrationReason.STREAM_BROKEN, 1.3)
    st.cancel_step(0, 1.4)  # the trainer went away: the request is dropped before it resumed
    assert st.status(5.0).preempted_slot_seconds == pytest.approx(0.2)  # 1.2 -> 1.4, not growing after the drop
