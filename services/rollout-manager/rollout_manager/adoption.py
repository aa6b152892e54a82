"""Held responses after a manager restart: how the manager takes back work it forgot.

A restarted manager knows nothing, but its workers kept the responses they were generating. On re-registering a
worker reports them (`on_held`); those of a step the trainer has not re-attached to yet are kept as orphans, for
orphan_ttl_s at most. Once the step comes (`add_step`), each is adopted (`adopt_orphans`): the request continues
from the held tokens (or is finished with them), instead of generating them all again, provided they fit the
request (same version, prompt and bounds, valid output).

`HeldResponses` owns the orphans and the count of adopted responses; it takes a running request off its worker
through leases.py and finishes a complete one through the lifecycle (lifecycle.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from rlboost.policies.migration import finish_reason_if_done
from rlboost.wire.rollout_io import HeldResponse

from . import metrics
from .book import RequestBook
from .effects import Effects
from .leases import Leases
from .lifecycle import RequestLifecycle
from .records import Phase, Request, invalid_output

# the state machine's one logger: its lines keep the name they had before ManagerState was split into modules
log = logging.getLogger("rollout_manager.state")


@dataclass(slots=True)
class Orphan:
    """A response a re-registered worker holds, for a step this manager has not been asked for (yet)."""

    held: HeldResponse
    worker: str
    since: float


class HeldResponses:
    """The responses workers held across a manager restart. Single-threaded, like the state."""

    def __init__(
        self,
        book: RequestBook,
        effects: Effects,
        leases: Leases,
        lifecycle: RequestLifecycle,
        max_orphans: int,
        orphan_ttl_s: float,
    ) -> None:
        """`max_orphans`: the most held responses kept for steps not re-attached yet (a step's most requests);
        `orphan_ttl_s`: how long they are kept for a step nobody re-attaches to."""
        self.book, self.effects, self.leases, self.lifecycle = book, effects, leases, lifecycle
        self.max_orphans = max_orphans
        self.orphan_ttl_s = orphan_ttl_s
        self._orphans: dict[str, Orphan] = {}  # request id -> a held response waiting for its step
        self.adopted = 0  # held responses adopted with their tokens

    def on_held(self, worker_id: str, held: list[HeldResponse], now: float) -> None:
        """A (re-)registered worker reports responses it kept across its broken stream: adopt those of known
        requests now; keep the others until the trainer re-attaches to their step (or orphan_ttl_s passes)."""
        for h in held:
            req = self.book.requests.get(h.request_id)
            if req is not None:
                self._adopt(req, h, worker_id, now)
            elif len(self._orphans) < self.max_orphans:
                self._orphans[h.request_id] = Orphan(h, worker_id, now)
        if held:
            log.info(
                "worker reported held responses",
                extra={"worker_id": worker_id, "held": len(held), "orphans": len(self._orphans)},
            )

    def adopt_orphans(self, ids: Iterable[str], now: float) -> None:
        """The trainer re-attached to a step with these request ids: adopt the held responses kept for them."""
        for rid in [rid for rid in ids if rid in self._orphans]:
            orphan = self._orphans.pop(rid)
            self._adopt(self.book.requests[rid], orphan.held, orphan.worker, now)

    def forget_old(self, now: float) -> None:
        """Forget the held responses of steps nobody re-attached to within orphan_ttl_s."""
        old = [rid for rid, o in self._orphans.items() if now - o.since > self.orphan_ttl_s]
        for rid in old:
            del self._orphans[rid]
        if old:
            log.info("held responses forgotten: no step re-attached", extra={"requests": len(old)})

    def _adopt(self, req: Request, h: HeldResponse, worker_id: str, now: float) -> None:
        """Continue `req` from the held response's tokens when it holds more than we do (its tokens are the same
        prefix: token-level continuation is deterministic per seed and position)."""
        if len(h.token_ids) <= len(req.tokens):
            return
        problem = self._adoption_problem(req, h)
        if problem is not None:
            metrics.ADOPTED.labels("refused").inc()
            log.warning(
                "held response refused", extra={"worker_id": worker_id, "request_id": req.id, "problem": problem}
            )
            return
        if req.phase is Phase.PENDING:
            self.book.pending_count[req.weight_version] -= 1  # its queue entry goes stale once it is finished below
        elif req.worker is not None:  # running afresh elsewhere, behind the held tokens: stop that run
            self.effects.revoke(req.worker, "adopted", req.id)
            metrics.REVOKES.labels("adopted").inc()
            self.leases.release(req, now)
            self.book.queue(req.weight_version).appendleft(req.id)
        req.tokens, req.logprobs = list(h.token_ids), list(h.logprobs)
        if not req.workers or req.workers[-1] != worker_id:
            req.workers.append(worker_id)
        req.phase, req.pending_since = Phase.PENDING, now
        self.adopted += 1
        metrics.ADOPTED.labels("adopted").inc()
        log.info(
            "held response adopted",
            extra={"worker_id": worker_id, "request_id": req.id, "tokens": len(req.tokens), "finished": h.finished},
        )
        done = finish_reason_if_done(req.tokens, req.sampling) or (h.finish_reason if h.finished else None)
        if done is not None:
            self.lifecycle.finish(req, done, now)
        else:
            self.book.pending_count[req.weight_version] += 1
        self.effects.dirty = True

    def _adoption_problem(self, req: Request, h: HeldResponse) -> str | None:
        """Why the held response cannot continue `req` (another version or prompt, too long, bad output)."""
        if h.weight_version != req.weight_version:
            return f"weight_version {h.weight_version}, the step's is {req.weight_version}"
        if h.prompt_ids != req.prompt:
            return "prompt_ids differ from the step's prompt"
        if len(h.token_ids) > req.sampling.max_new_tokens:
            return f"{len(h.token_ids)} tokens is over max_new_tokens {req.sampling.max_new_tokens}"
        return invalid_output(h.token_ids, h.logprobs, req.vocab_size)
