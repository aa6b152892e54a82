"""The worker's held responses (pure): what a re-registration reports after the stream broke."""

from __future__ import annotations

from rlboost.wire.rollout_io import Assignment, SamplingParams
from rollout_worker.held import HeldResponses


def _assignment(rid: str, generated: list[int], prior_logprobs: list[float] | None = None) -> Assignment:
    logprobs = [-1.0] * len(generated) if prior_logprobs is None else prior_logprobs
    return Assignment(rid, 1, [7, 7, *generated], 2, SamplingParams(max_new_tokens=9), 3, logprobs)


def test_paused_and_recently_finished_are_reported_with_the_whole_response():
    held = HeldResponses(capacity=2, keep_finished_s=10.0)
    paused, done, revoked = _assignment("p", [1]), _assignment("d", []), _assignment("r", [])
    for a in (paused, done, revoked):
        held.start(a)
        held.add(a, [4, 5], [-0.1, -0.2])
    held.end(done, finished=True, reason="stop", lost=False, now=1.0)
    held.end(revoked, finished=False, reason="abort", lost=False, now=1.0)  # handed back: forgotten
    held.end(paused, finished=False, reason="abort", lost=True, now=2.0)
    p, d = held.report(now=3.0)
    assert (p.request_id, p.prompt_ids, p.token_ids, p.logprobs, p.finished) == (
        "p",
        [7, 7],
        [1, 4, 5],
        [-1.0, -0.1, -0.2],
        False,
    )
    assert (d.request_id, d.token_ids, d.finished, d.finish_reason, d.weight_version) == ("d", [4, 5], True, "stop", 3)
    assert [h.request_id for h in held.report(now=20.0)] == ["p"]  # finished ones are kept keep_finished_s
    held.clear()
    assert held.report(now=20.0) == [] and len(held) == 0


def test_unknown_prior_logprobs_are_not_reported_and_a_newer_lease_replaces_the_old():
    held = HeldResponses(capacity=1)
    a = _assignment("x", [1, 2], prior_logprobs=[])
    held.start(a)
    held.end(a, finished=False, reason="abort", lost=True, now=0.0)
    assert held.report(now=0.0) == []  # its earlier tokens' log-probs are unknown: the manager starts it afresh
    old, new = _assignment("y", []), _assignment("y", [3])
    held.start(old)
    held.start(new)
    held.add(old, [8], [-0.3])  # the old lease's late token is not the new one's
    held.end(old, finished=False, reason="abort", lost=False, now=0.0)
    held.end(new, finished=False, reason="abort", lost=True, now=0.0)
    assert [h.token_ids for h in held.report(now=0.0)] == [[3]]


def test_a_held_response_carries_its_assignments_ticket_and_lease_epoch():
    held = HeldResponses(capacity=1)
    a = _assignment("t", [])
    a.ticket, a.lease_epoch = "ab" * 32, 4
    held.pause_waiting(a)
    held.add(a, [5], [-0.3])
    (h,) = held.report(now=0.0)
    assert (h.ticket, h.lease_epoch) == ("ab" * 32, 4)  # what the restarted manager checks against this worker


def test_finished_responses_are_forgotten_in_finishing_order_and_a_restart_is_kept():
    held = HeldResponses(capacity=1, keep_finished_s=10.0)
    for n in range(100):  # one finishes each second: those older than 10 s go as the next ones finish
        a = _assignment(f"r{n}", [])
        held.start(a)
        held.end(a, finished=True, reason="stop", lost=False, now=float(n))
    assert len(held) == 11  # r89..r99 (finished within the last 10 s of t = 99)
    again = _assignment("r95", [])  # restarted under a new lease after it finished: running, not forgotten
    held.start(again)
    held.end(_assignment("late", []), finished=True, reason="stop", lost=False, now=200.0)  # unknown: ignored
    held.report(now=200.0)
    assert len(held) == 1 and held.report(now=200.0) == []  # r95 runs (not reported), the finished ones are gone
