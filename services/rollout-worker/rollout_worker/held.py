"""The responses a worker keeps so that a restarted rollout-manager loses none of their tokens.

Pure bookkeeping, no I/O. Each running request's whole response so far (the tokens its assignment carried from
earlier workers, with their log-probs, and every token generated here, sent or not) is kept while it runs.
When the Connect stream breaks, the session aborts its requests: they are *paused* here with their tokens
(generation stops, so a greedy continuation from exactly these tokens is bit-identical to an uninterrupted
run). Requests that finish are kept `keep_finished_s` more, because their last chunk may have died with the
manager before the trainer got the trajectory. On the next Register the worker reports all of them
(`Register.held`); a restarted manager adopts them when the trainer re-attaches to their step, and a manager
that never went away ignores what it already has.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from rlboost.wire.rollout_io import Assignment, HeldResponse
from rlboost.wire.rollout_proto import MAX_HELD_PER_CAPACITY


@dataclass
class _Response:
    assignment: Assignment
    tokens: list[int]  # the whole response so far
    logprobs: list[float]
    complete: bool  # the log-probs of the tokens carried in the assignment are known (else it cannot be reported)
    state: str = "running"  # "running" | "paused" | "finished"
    finish_reason: str = ""
    finished_at: float = 0.0


class HeldResponses:
    """Responses of this worker, by request id; `report()` is what a re-registration hands over."""

    def __init__(self, capacity: int, keep_finished_s: float = 30.0) -> None:
        self.limit = MAX_HELD_PER_CAPACITY * max(1, capacity)  # what the manager accepts in one Register
        self.keep_finished_s = keep_finished_s
        self._responses: dict[str, _Response] = {}
        # (finished_at, request id) in finishing order: forgetting the old ones reads only those, not every response
        # held (a scan per finished request cost a tenth of a CPU worker's time at ~5,000 responses held)
        self._finished: deque[tuple[float, str]] = deque()

    def __len__(self) -> int:
        return len(self._responses)

    def start(self, a: Assignment) -> None:
        """The request starts (or restarts under a new lease) from the tokens its assignment carries."""
        prior = a.input_ids[a.prompt_len :]
        complete = len(a.prior_logprobs) == len(prior)
        self._responses[a.request_id] = _Response(a, list(prior), list(a.prior_logprobs) if complete else [], complete)

    def add(self, a: Assignment, tokens: list[int], logprobs: list[float]) -> None:
        r = self._current(a)
        if r is not None:
            r.tokens += tokens
            r.logprobs += logprobs

    def end(self, a: Assignment, finished: bool, reason: str, lost: bool, now: float) -> None:
        """The request's generation ended: finished (kept a while), paused because the stream was `lost`, or
        handed back to the manager (revoke, drain, a failure: forgotten)."""
        r = self._current(a)
        if r is None:
            return
        if finished:
            r.state, r.finish_reason, r.finished_at = "finished", reason, now
            self._finished.append((now, a.request_id))
            self._forget_old(now)
        elif lost:
            r.state = "paused"
        else:
            del self._responses[a.request_id]

    def pause_waiting(self, a: Assignment) -> None:
        """An assignment that never started here (waiting for weights or memory) when the stream broke."""
        self.start(a)
        self._responses[a.request_id].state = "paused"

    def report(self, now: float) -> list[HeldResponse]:
        """Paused responses first, then those finished within keep_finished_s (newest first), up to the limit."""
        self._forget_old(now)
        paused = [r for r in self._responses.values() if r.state == "paused"]
        finished = sorted((r for r in self._responses.values() if r.state == "finished"), key=lambda r: -r.finished_at)
        return [_held(r) for r in paused + finished if r.complete and r.tokens][: self.limit]

    def clear(self) -> None:
        """A manager took the report: it owns these responses now."""
        self._responses = {k: r for k, r in self._responses.items() if r.state == "running"}

    def _current(self, a: Assignment) -> _Response | None:
        r = self._responses.get(a.request_id)
        return r if r is not None and r.assignment is a else None  # a later lease of the request replaced it

    def _forget_old(self, now: float) -> None:
        """Forget the responses finished more than keep_finished_s ago (the oldest are first in `_finished`; an
        entry whose request was cleared or started again since is skipped)."""
        while self._finished and now - self._finished[0][0] > self.keep_finished_s:
            at, key = self._finished.popleft()
            r = self._responses.get(key)
            if r is not None and r.state == "finished" and r.finished_at == at:
                del self._responses[key]


def _held(r: _Response) -> HeldResponse:
    a = r.assignment
    return HeldResponse(
        request_id=a.request_id,
        weight_version=a.weight_version,
        prompt_ids=a.input_ids[: a.prompt_len],
        token_ids=list(r.tokens),
        logprobs=list(r.logprobs),
        finished=r.state == "finished",
        finish_reason=r.finish_reason if r.state == "finished" else "",
        ticket=a.ticket,  # the manager adopts the response only with the ticket of this worker's assignment
        lease_epoch=a.lease_epoch,
    )
