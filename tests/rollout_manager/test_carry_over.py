"""The version marks of a carried response (carry_over.switch_version, version_spans) and CarryOver's delivery of a
request that finished while carried."""

from __future__ import annotations

from array import array

from rlboost.wire.rollout_io import CarriedGroup, PromptItem, RolloutRequest, SamplingParams, Trajectory
from rollout_manager.book import RequestBook
from rollout_manager.carry_over import CarryOver, switch_version, version_spans
from rollout_manager.effects import Effects
from rollout_manager.fleet import Fleet
from rollout_manager.leases import Leases
from rollout_manager.records import Request

STEP = RolloutRequest(0, 0, [PromptItem(0, [9])], 1, SamplingParams(max_new_tokens=8))


def _request(tokens: int, version: int = 0) -> Request:
    req = Request("s0-p0-g0", 0, 0, 0, [9], SamplingParams(), weight_version=version, pending_since=0.0)
    req.tokens = array("i", range(tokens))
    return req


def test_a_response_of_one_version_has_no_spans():
    assert version_spans(_request(3, version=2)) == (2, [])


def test_each_run_of_tokens_is_marked_with_its_version_and_an_empty_run_vanishes():
    req = _request(3)
    req.next_version = 1
    switch_version(req)
    req.next_version = 2  # carried again before a token came under version 1
    switch_version(req)
    req.tokens.extend([7, 7])
    assert (req.weight_version, req.next_version, req.marks) == (2, None, [(0, 0), (3, 2)])
    assert version_spans(req) == (0, [(0, 3), (2, 2)])


def test_switching_to_the_version_held_changes_nothing():
    req = _request(3, version=1)
    req.next_version = 1
    switch_version(req)
    assert (req.marks, req.next_version) == ([], None)


def test_a_request_that_finished_while_carried_waits_for_the_step_that_continues_it():
    effects, book = Effects(), RequestBook()
    carry = CarryOver(book, effects, Leases(book, Fleet(effects), effects, revoke_timeout_s=1.0))
    req = book.new_request(STEP, 0, 0, 0, [9], now=0.0)
    book.enqueue(req)
    book.steps[0] = {req.id}
    assert carry.carry_step(0) == 1 and carry.carried_total == 1 and 0 not in book.steps
    traj = Trajectory(req.id, 0, 0, 0, [9], [1], [-0.1], "stop", 0)
    carry.deliver(req, traj)
    assert effects.take_delivered() == []  # no stream waits for it until the next step
    wanted = RolloutRequest(1, 1, [], 1, SamplingParams(), target_groups=1, carried=[CarriedGroup(0, 0, [9], [0])])
    ids: set[str] = set()
    assert carry.continue_step(wanted, ids, set(), now=1.0) == 1 and ids == set()
    (done,) = effects.take_delivered()
    assert done is traj and carry.delivery_step(done) == 1 and carry.delivery_step(done) == 0


def test_a_step_sent_again_while_its_request_is_carried_retires_the_earlier_incarnation():
    """A resumed trainer sends step 0 again while s0-p0-g0, carried past the step's end, still runs on worker a:
    the earlier lease is revoked and fenced (its late chunk is stale), the new request's lease epoch goes on from
    it, and only the new incarnation's tokens are delivered (before: the request was silently replaced, the old
    lease stayed on the worker at the same epoch and its chunks passed as the new one's)."""
    import dataclasses

    from rlboost.wire.rollout_io import Pool, TokenChunk, WorkerRegistration
    from rollout_manager.state import ManagerState

    st = ManagerState(lease_timeout_s=10)
    st.register(WorkerRegistration("a", Pool.SPOT, "n", 4, 0), 0.0)
    step = RolloutRequest(0, 0, [PromptItem(0, [3])], 1, SamplingParams(max_new_tokens=8), target_groups=1)
    st.add_step(step, 0.0)
    st.schedule(0.0)
    (old,) = st.take_outbox()["a"].assign
    st.on_chunks("a", [TokenChunk(old.request_id, old.lease_epoch, 0, [7, 7], [-0.1, -0.1], False, "")], 0.5)
    st.carry_step(0)  # the stream ended at its target: s0-p0-g0 runs on, carried
    st.add_step(dataclasses.replace(step, target_groups=0), 1.0)  # the same step sent again
    outbox = st.take_outbox()["a"]
    assert old.request_id in {rid for rids in outbox.revoke.values() for rid in rids}  # the old lease revoked
    assert old.request_id not in st.workers["a"].running
    st.schedule(1.0)
    (new,) = st.take_outbox()["a"].assign
    assert new.request_id == old.request_id and new.lease_epoch > old.lease_epoch
    late = TokenChunk(old.request_id, old.lease_epoch, 2, [8], [-0.2], True, "stop")  # the old incarnation's
    st.on_chunks("a", [late], 1.5)
    assert list(st.requests[new.request_id].tokens) == [] and not st.take_delivered()
    st.on_chunks("a", [TokenChunk(new.request_id, new.lease_epoch, 0, [5], [-0.3], True, "stop")], 2.0)
    (traj,) = st.take_delivered()
    assert list(traj.response_ids) == [5]
