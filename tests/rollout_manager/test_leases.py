"""Leases alone: an assignment is a new epoch that continues from the tokens held, a revoke asks for a flush by a
deadline and only of a running request, and a dropped running request is revoked and its slot freed."""

from __future__ import annotations

from array import array

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import Pool, PromptItem, RolloutRequest, SamplingParams, WorkerRegistration
from rollout_manager.book import RequestBook
from rollout_manager.effects import Effects
from rollout_manager.fleet import Fleet
from rollout_manager.leases import Leases
from rollout_manager.records import Phase

STEP = RolloutRequest(0, 0, [PromptItem(0, [9, 9])], 1, SamplingParams(max_new_tokens=8))


def _leases():
    effects = Effects()
    book, fleet = RequestBook(), Fleet(effects)
    fleet.add(WorkerRegistration("a", Pool.SPOT, node="n", capacity=1, weight_version=0), now=0.0)
    req = book.new_request(STEP, 0, 0, 0, [9, 9], now=0.0)
    book.enqueue(req)
    return Leases(book, fleet, effects, revoke_timeout_s=2.0), req


def test_an_assignment_is_a_new_epoch_continuing_from_the_tokens_held():
    leases, req = _leases()
    req.tokens, req.logprobs = array("i", [4, 5]), array("f", [-0.5, -0.5])
    leases.assign(req, leases.fleet.workers["a"], now=1.0)
    (a,) = leases.effects.take_outbox()["a"].assign
    assert (a.lease_epoch, a.input_ids, a.prompt_len, a.prior_logprobs) == (1, [9, 9, 4, 5], 2, [-0.5, -0.5])
    assert (req.phase, req.worker, req.tokens_at_assign) == (Phase.RUNNING, "a", 2)
    assert (leases.book.pending_total, leases.book.held_total, leases.fleet.free_workers()) == (0, 1, [])


def test_a_revoke_asks_for_a_flush_by_a_deadline_and_only_of_a_running_request():
    leases, req = _leases()
    assert not leases.revoke(req.id, MigrationReason.REBALANCE, now=0.5)  # pending: nothing to revoke
    leases.assign(req, leases.fleet.workers["a"], now=1.0)
    leases.effects.take_outbox()
    assert leases.revoke(req.id, MigrationReason.REVOKED, now=1.0, wire_reason="carried")
    assert not leases.revoke(req.id, MigrationReason.REVOKED, now=1.0)  # already revoking
    assert leases.effects.take_outbox()["a"].revoke == {"carried": [req.id]}
    assert leases.overdue(2.9) == [] and leases.overdue(3.0) == [req]
    leases.release(req, now=3.0)
    assert leases.overdue(9.0) == [] and req.worker is None and leases.fleet.free_workers()


def test_a_dropped_running_request_is_revoked_and_its_slot_freed():
    leases, req = _leases()
    leases.assign(req, leases.fleet.workers["a"], now=1.0)
    leases.drop(req.id, now=2.0)
    assert leases.effects.take_outbox()["a"].revoke == {"cancelled": [req.id]}
    assert req.id not in leases.book.requests and leases.book.dropped_epochs == {req.id: 1}
    assert leases.book.held_total == 0 and [w.id for w in leases.fleet.free_workers()] == ["a"]


def test_a_running_request_with_no_token_for_the_stall_limit_is_revoked():
    leases, req = _leases()
    leases.assign(req, leases.fleet.workers["a"], now=1.0)
    assert leases.revoke_stalled(now=3.0, limit=2.0) == 0
    assert leases.revoke_stalled(now=3.5, limit=2.0) == 1 and req.revoke_reason is MigrationReason.STALLED
