"""Held responses after a manager restart: the part of `ManagerState` that takes back work a restarted manager
forgot.

A restarted manager knows nothing, but its workers kept the responses they were generating. On re-registering a
worker reports them (`on_held`); those of a step the trainer has not re-attached to yet are kept as orphans, for
orphan_ttl_s at most. Once the step comes (`add_step`), each is adopted: the request continues from the held tokens
(or is finished with them), instead of generating them all again, provided they fit the request (same version,
prompt and bounds, valid output).

A mixin, not a collaborator: it reads and writes the bookkeeping `ManagerState.__init__` sets up (`requests`,
`_orphans`, `adopted`, `orphan_ttl_s`, `_pending`, `_pending_count`, `policy`) and calls its transitions
(`_box`, `_release`, `_finish`).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from rlboost.policies.migration import finish_reason_if_done
from rlboost.wire.rollout_io import HeldResponse

from . import metrics
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
    """`ManagerState`'s adoption of held responses (see the module docstring)."""

    def on_held(self, worker_id: str, held: list[HeldResponse], now: float) -> None:
        """A (re-)registered worker reports responses it kept across its broken stream: adopt those of known
        requests now; keep the others until the trainer re-attaches to their step (or orphan_ttl_s passes)."""
        for h in held:
            req = self.requests.get(h.request_id)
            if req is not None:
                self._adopt(req, h, worker_id, now)
            elif len(self._orphans) < self.policy.max_step_requests:
                self._orphans[h.request_id] = Orphan(h, worker_id, now)
        if held:
            log.info(
                "worker reported held responses",
                extra={"worker_id": worker_id, "held": len(held), "orphans": len(self._orphans)},
            )

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
            self._pending_count[req.weight_version] -= 1  # its queue entry goes stale once it is finished below
        elif req.worker is not None:  # running afresh elsewhere, behind the held tokens: stop that run
            self._box(req.worker).revoke.setdefault("adopted", []).append(req.id)
            metrics.REVOKES.labels("adopted").inc()
            self._release(req, now)
            self._pending.setdefault(req.weight_version, deque()).appendleft(req.id)
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
            self._finish(req, done, now)
        else:
            self._pending_count[req.weight_version] += 1
        self.dirty = True

    def _adoption_problem(self, req: Request, h: HeldResponse) -> str | None:
        """Why the held response cannot continue `req` (another version or prompt, too long, bad output)."""
        if h.weight_version != req.weight_version:
            return f"weight_version {h.weight_version}, the step's is {req.weight_version}"
        if h.prompt_ids != req.prompt:
            return "prompt_ids differ from the step's prompt"
        if len(h.token_ids) > req.sampling.max_new_tokens:
            return f"{len(h.token_ids)} tokens is over max_new_tokens {req.sampling.max_new_tokens}"
        return invalid_output(h.token_ids, h.logprobs, req.vocab_size)

    def _forget_orphans(self, now: float) -> None:
        old = [rid for rid, o in self._orphans.items() if now - o.since > self.orphan_ttl_s]
        for rid in old:
            del self._orphans[rid]
        if old:
            log.info("held responses forgotten: no step re-attached", extra={"requests": len(old)})
