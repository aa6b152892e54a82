"""The requests the manager holds and where they wait: requests by id, the pending queue and count of each weight
version, how many of each version are held by workers, the ids each step's stream still owes, and the lease epochs
of dropped requests.

Bookkeeping only: what moves a request from one phase to another is leases.py's and lifecycle.py's. A pending
queue may hold stale ids (a request that left the queue by another way: dropped, adopted, finished); readers skip
them, and the per-version count is exact.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from rlboost.wire.rollout_io import RolloutRequest, SamplingParams, request_id, sample_seed

from .records import Phase, Request

# Lease epochs of dropped requests kept for a step sent again (cancel_step): the newest this many. A restarted
# trainer re-sends the step it was on, a few thousand ids at most; a step never sent again ages out.
MAX_DROPPED_EPOCHS = 65_536


class RequestBook:
    """Requests, queues and counts of one manager. Single-threaded, like the state."""

    def __init__(self) -> None:
        self.requests: dict[str, Request] = {}
        self.pending: dict[int, deque[str]] = {}  # version -> ids (may hold stale ids; skipped)
        self.pending_count: Counter[int] = Counter()  # version -> exact number pending
        self.held_count: Counter[int] = Counter()  # version -> running + revoking
        self.steps: dict[int, set[str]] = {}  # step -> ids not yet delivered
        self.dropped_epochs: dict[str, int] = {}  # request id -> last lease epoch, of requests of cancelled steps

    @property
    def pending_total(self) -> int:
        return sum(self.pending_count.values())

    @property
    def held_total(self) -> int:
        return sum(self.held_count.values())

    def queue(self, version: int) -> deque[str]:
        """The pending queue of `version`."""
        return self.pending.setdefault(version, deque())

    def enqueue(self, req: Request) -> None:
        """Pending under its version, last in line."""
        self.queue(req.weight_version).append(req.id)
        self.pending_count[req.weight_version] += 1

    def requeue(self, req: Request) -> None:
        """Pending again under its version, first in line (it has tokens: the earliest to finish)."""
        self.queue(req.weight_version).appendleft(req.id)
        self.pending_count[req.weight_version] += 1

    def new_request(
        self, r: RolloutRequest, step: int, prompt_index: int, sample: int, prompt: list[int], now: float
    ) -> Request:
        """A fresh pending request of `r` (not queued yet) for sample `sample` of a prompt of `step` (r.step, or
        an earlier step whose sample r carries), continuing the leases of the id if it was dropped."""
        rid = request_id(step, prompt_index, sample)
        seed = sample_seed(r.sampling.seed, step, prompt_index, sample)
        req = self.requests[rid] = Request(
            id=rid,
            step=step,
            prompt_index=prompt_index,
            sample_index=sample,
            prompt=list(prompt),
            sampling=SamplingParams(**{**r.sampling.__dict__, "seed": seed}),
            weight_version=r.weight_version,
            lease_epoch=self.dropped_epochs.pop(rid, 0),  # an id sent again: its leases go on
            pending_since=now,
            vocab_size=r.vocab_size,
        )
        return req

    def forget(self, rid: str) -> Request | None:
        """Drop the request, keeping its lease epoch: a trainer that comes back sends its step again, with the same
        ids, and their leases must not start over, or a late chunk of this incarnation (same worker, same epoch)
        would pass as one of the next."""
        req = self.requests.pop(rid, None)
        if req is None:
            return None
        self.dropped_epochs.pop(rid, None)  # re-inserted at the end: the dict's order is the drops' order
        self.dropped_epochs[rid] = req.lease_epoch
        if len(self.dropped_epochs) > MAX_DROPPED_EPOCHS:  # bounded: the oldest drop is forgotten
            del self.dropped_epochs[next(iter(self.dropped_epochs))]
        return req

    def close(self, req: Request) -> None:
        """The request is off its stream's list (delivered or failed); a list left empty goes."""
        self.steps.get(req.stream_step, set()).discard(req.id)
        if not self.steps.get(req.stream_step, True):
            del self.steps[req.stream_step]

    def pop_pending(self, queue: deque[str], worker_id: str, workers: Callable[[], int]) -> Request | None:
        """The first pending request for `worker_id`, skipping (and keeping in order) those that failed on it
        while another of the version's `workers()` (counted only then) may take them."""
        skipped: list[str] = []
        found = None
        while queue:
            rid = queue.popleft()
            req = self.requests.get(rid)
            if req is None or req.phase is not Phase.PENDING:
                continue
            if worker_id in req.failed_on and len(req.failed_on) < workers():
                skipped.append(rid)
                continue
            found = req
            break
        queue.extendleft(reversed(skipped))
        return found

    def take_pending(self, queue: deque[str], n: int) -> list[Request]:
        """Up to `n` distinct pending requests off the head of `queue` (stale ids dropped). An id can be queued
        twice: a dropped pending request leaves its entry behind, and a step sent again (a restarted trainer)
        queues the same ids anew; both entries then name the one request, which must be placed once."""
        out: dict[str, Request] = {}
        while queue and len(out) < n:
            req = self.requests.get(queue.popleft())
            if req is not None and req.phase is Phase.PENDING:
                out.setdefault(req.id, req)
        return list(out.values())
