"""A request's lease on a worker: granting it (`assign`: a new lease epoch, an Assignment in the worker's outbox),
ending it (`release`), asking the worker to give it back (`revoke`: stop and flush by a deadline), and dropping a
request nobody waits for any more (`drop`). Owns the set of requests being revoked.

A chunk whose (worker, lease_epoch) is not its request's current lease is stale: the epoch grows on every
assignment, so a zombie worker's late chunks never pass as the new lease's.
"""

from __future__ import annotations

import logging

from rlboost.policies.migration import MigrationReason, continuation
from rlboost.wire.rollout_io import Assignment

from . import metrics
from .book import RequestBook
from .effects import Effects
from .fleet import Fleet
from .records import Phase, Request, Worker
from .speeds import observe_rate

# the state machine's one logger: its lines keep the name they had before ManagerState was split into modules
log = logging.getLogger("rollout_manager.state")


class Leases:
    """Grants and ends the leases of one manager's requests. Single-threaded, like the state."""

    def __init__(self, book: RequestBook, fleet: Fleet, effects: Effects, revoke_timeout_s: float) -> None:
        self.book, self.fleet, self.effects = book, fleet, effects
        self.revoke_timeout_s = revoke_timeout_s
        self.revoking: set[str] = set()  # REVOKING requests: each migrates on its flush or at its deadline

    def assign(self, req: Request, w: Worker, now: float) -> None:
        """Lease the pending request to `w` under a new epoch; the worker continues it from its tokens."""
        req.lease_epoch += 1
        req.phase, req.worker, req.assigned_at, req.tokens_at_assign = Phase.RUNNING, w.id, now, len(req.tokens)
        req.progress_at = now
        self.fleet.hold(w, req.id, now)
        self.book.pending_count[req.weight_version] -= 1
        self.book.held_count[req.weight_version] += 1
        input_ids, prompt_len = continuation(req.prompt, list(req.tokens))
        self.effects.box(w.id).assign.append(
            Assignment(
                req.id, req.lease_epoch, input_ids, prompt_len, req.sampling, req.weight_version, list(req.logprobs)
            )
        )
        metrics.ASSIGNMENTS.inc()
        metrics.ASSIGN_LATENCY.observe(max(0.0, now - req.pending_since))

    def release(self, req: Request, now: float | None) -> None:
        """Take the request off its worker (no lease any more: its chunks become stale). `now`: None when the
        caller has no clock (a cancelled step): the busy spell it ends is not counted."""
        w = self.fleet.workers.get(req.worker) if req.worker else None
        if w is not None:
            observe_rate(w, req, now)
            self.fleet.let_go(w, req.id, now)
        self.book.held_count[req.weight_version] -= 1
        self.revoking.discard(req.id)
        req.worker = None
        self.effects.dirty = True

    def revoke(self, rid: str, reason: MigrationReason, now: float, wire_reason: str | None = None) -> bool:
        """Ask the worker to stop the request and flush; it migrates on the flush or at the deadline."""
        req = self.book.requests.get(rid)
        if req is None or req.phase is not Phase.RUNNING or req.worker is None:
            return False
        req.phase, req.revoke_reason = Phase.REVOKING, reason
        req.revoke_deadline = now + self.revoke_timeout_s
        self.revoking.add(rid)
        label = wire_reason or reason.value
        self.effects.revoke(req.worker, label, rid)
        metrics.REVOKES.labels(label).inc()
        return True

    def drop(self, rid: str, now: float | None) -> None:
        """Forget a request nobody waits for any more, revoking it from its worker."""
        req = self.book.forget(rid)
        if req is None:
            return
        if req.phase is Phase.PENDING:
            self.book.pending_count[req.weight_version] -= 1
        elif req.worker is not None:
            self.effects.revoke(req.worker, "cancelled", rid)
            self.release(req, now)
            metrics.REVOKES.labels("cancelled").inc()

    def overdue(self, now: float) -> list[Request]:
        """Revoked requests whose worker did not flush them by their deadline."""
        late = [rid for rid in self.revoking if self.book.requests[rid].revoke_deadline <= now]
        return [self.book.requests[rid] for rid in late]

    def revoke_stalled(self, now: float, limit: float) -> int:
        """Revoke running requests that got no token for `limit` seconds, even from a heartbeating worker."""
        requests = self.book.requests
        stalled = [
            rid
            for w in self.fleet.workers.values()
            for rid in w.running
            if requests[rid].phase is Phase.RUNNING and now - requests[rid].progress_at > limit
        ]
        for rid in stalled:
            log.warning("request stalled", extra={"request_id": rid, "worker_id": requests[rid].worker})
            self.revoke(rid, MigrationReason.STALLED, now)
        return len(stalled)
