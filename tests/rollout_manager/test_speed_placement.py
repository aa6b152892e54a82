"""SpeedPlacement alone: a response the speed rebalance revoked goes to the worker it was revoked for once it is
back pending, and the length prior comes from the finished responses of its group, else of its step."""

from __future__ import annotations

from array import array

from rlboost.policies.migration import MigrationReason
from rlboost.policies.placement import expected_remaining
from rlboost.wire.rollout_io import Pool, PromptItem, RolloutRequest, SamplingParams, WorkerRegistration
from rollout_manager.book import RequestBook
from rollout_manager.effects import Effects
from rollout_manager.fleet import Fleet
from rollout_manager.leases import Leases
from rollout_manager.records import Phase
from rollout_manager.speed_placement import SpeedPlacement

STEP = RolloutRequest(0, 0, [PromptItem(0, [9]), PromptItem(1, [9])], 2, SamplingParams(max_new_tokens=100))


def _speed() -> SpeedPlacement:
    effects = Effects()
    book, fleet = RequestBook(), Fleet(effects)
    for wid in ("slow", "fast"):
        fleet.add(WorkerRegistration(wid, Pool.SPOT, node=wid, capacity=2, weight_version=0), now=0.0)
    return SpeedPlacement(book, fleet, Leases(book, fleet, effects, 1.0), aware=True, migration_cost_s=2.0, moves=4)


def test_a_revoked_response_goes_to_its_target_once_flushed():
    speed = _speed()
    speed.book.enqueue(speed.book.new_request(STEP, 0, 0, 0, [9], now=0.0))
    (req,) = speed.book.take_pending(speed.book.queue(0), 1)
    speed.leases.assign(req, speed.fleet.workers["slow"], now=0.0)
    speed.leases.revoke(req.id, MigrationReason.SPEED_REBALANCE, now=1.0)
    speed.targets[req.id] = "fast"
    assert speed.place_targets(1.0) == 0 and speed.targets == {req.id: "fast"}  # still flushing on the slow one
    speed.leases.release(req, now=1.5)
    req.phase = Phase.PENDING
    speed.book.requeue(req)
    assert speed.place_targets(2.0) == 1 and req.worker == "fast" and speed.targets == {}
    assert not speed.book.pending[0]


def test_the_length_prior_is_the_group_s_else_the_step_s_else_the_budget():
    speed = _speed()
    waiting = [speed.book.new_request(STEP, 0, prompt, 0, [9], now=0.0) for prompt in (0, 1, 2)]
    assert [speed.expected_remaining(r) for r in waiting] == [expected_remaining(0, 100, 100)] * 3
    speed.book.steps[0] = {r.id for r in waiting}
    for prompt, tokens in ((0, 40), (1, 80)):
        done = speed.book.new_request(STEP, 0, prompt, 1, [9], now=0.0)
        done.tokens = array("i", range(tokens))
        speed.note_length(done)
    expected = [expected_remaining(0, mean, 100) for mean in (40, 80, 60)]  # prompt 2: the step's mean
    assert [speed.expected_remaining(r) for r in waiting] == expected
    assert speed.rebalancing and not SpeedPlacement(speed.book, speed.fleet, speed.leases, False, 2.0, 4).rebalancing
