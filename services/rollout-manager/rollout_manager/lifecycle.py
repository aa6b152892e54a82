"""A leased request's life from what its worker reports: a chunk's tokens kept, refused or fenced as stale; a failed
attempt; and where the request goes when it leaves its worker: back to pending with every token received, first in
line (`migrate`), finished and delivered (`finish`), or given up after its attempts (`give_up`).

One chunk's handling reads here from top to bottom; it calls the carry-over (carry_over.py) where a response of a
carried request changes version or is delivered, and the speed placement for the length prior of what finished.
"""

from __future__ import annotations

import functools
import logging

from rlboost.policies.migration import FAILED_ATTEMPT, MigrationReason, finish_reason_if_done
from rlboost.wire.rollout_io import TokenBounds, TokenChunk, Trajectory

from . import metrics
from .book import RequestBook
from .carry_over import CarryOver, switch_version, version_spans
from .effects import Effects
from .fleet import Fleet
from .leases import Leases
from .preemption_costs import PreemptionCosts
from .records import MAX_LOGPROB, MIN_LOGPROB, Phase, Request, Worker, invalid_output
from .speed_placement import SpeedPlacement
from .status import Tally
from .steps import RequestPolicy

# the state machine's one logger: its lines keep the name they had before ManagerState was split into modules
log = logging.getLogger("rollout_manager.state")


@functools.cache
def _tokens_received(pool: str):
    """The pool's labelled token counter; `labels()` costs more than the increment on the per-chunk path."""
    return metrics.TOKENS_RECEIVED.labels(pool)


class RequestLifecycle:
    """What becomes of one manager's leased requests. Single-threaded, like the state."""

    def __init__(
        self,
        book: RequestBook,
        fleet: Fleet,
        leases: Leases,
        effects: Effects,
        carry: CarryOver,
        speed: SpeedPlacement,
        tally: Tally,
        policy: RequestPolicy,
    ) -> None:
        self.book, self.fleet, self.leases, self.effects = book, fleet, leases, effects
        self.carry, self.speed, self.tally, self.policy = carry, speed, tally, policy
        self._refusals_logged: set[tuple[str, str]] = set()  # (worker, problem): invalid output is logged once
        self.costs = PreemptionCosts()  # what each preemption cost (issue 34)

    # ---- chunks ------------------------------------------------------------------------------------

    def on_chunks(
        self, worker_id: str, chunks: list[TokenChunk], now: float, bounds: TokenBounds | None = None
    ) -> None:
        """One worker's batch of chunks. `bounds`: the extremes of every token in the batch (computed once for the
        batch): when they lie within the bounds no chunk needs its own pass; without them each chunk is checked."""
        w = self.fleet.alive(worker_id, now)
        if w is None:
            metrics.STALE_CHUNKS.inc(len(chunks))
            return
        # the batch's token ids are checked against each request's vocabulary (a comparison per chunk)
        max_id = (
            bounds.max_token_id
            if bounds and MIN_LOGPROB <= bounds.min_logprob <= bounds.max_logprob <= MAX_LOGPROB
            else None
        )
        before = self.tally.tokens_received
        for c in chunks:
            self._on_chunk(w, c, now, max_id)
        if n := self.tally.tokens_received - before:  # metrics once per batch: a labelled inc() costs more than a chunk
            pool = w.reg.pool.value
            self.tally.pool_tokens[pool] += n
            _tokens_received(pool).inc(n)

    def _on_chunk(self, w: Worker, c: TokenChunk, now: float, max_id: int | None = None) -> None:
        """`max_id`: the largest token id of the chunk's batch, whose log-probs are known to be in range (None:
        unknown, check the chunk alone)."""
        req = self.book.requests.get(c.request_id)
        if req is None or req.worker != w.id or req.lease_epoch != c.lease_epoch:
            metrics.STALE_CHUNKS.inc()  # a zombie's late chunk, or one of a cancelled request
            return
        vocab = req.vocab_size
        in_bounds = max_id is not None and (not vocab or max_id < vocab)
        if c.token_ids and not in_bounds and (problem := invalid_output(c.token_ids, c.logprobs, vocab)) is not None:
            self._refuse_output(w, req, problem, now)
            return
        # "abort": the worker stopped it (revoke, drain) and sent every token it made; `finished` may be either
        aborted = c.finish_reason == "abort"
        if c.offset != len(req.tokens):
            self._offset_gap(req, c, aborted, now)
            return
        if c.token_ids:
            req.progress_at = now
            if req.id in self.costs.moved:  # the first tokens after a preemption moved it
                self.costs.resumed(req, w, now)
            self._keep_tokens(w, req, c)
            budget = req.sampling.max_new_tokens
            if len(req.tokens) > budget:  # never deliver more than the response budget
                del req.tokens[budget:], req.logprobs[budget:]
        if aborted and c.error:  # the request failed on this worker by itself (the others of its batch go on)
            self._failed_on_worker(w, req, c.error, c.invalid_input, now)
        elif aborted:
            reason = req.revoke_reason if req.phase is Phase.REVOKING else MigrationReason.DRAINED
            self.migrate(req, reason, now, source=w, flushed=True)
            self.costs.worker_done(w, now)
        elif len(req.tokens) >= req.sampling.max_new_tokens and not c.finished:
            self.finish(req, "length", now)
        elif c.finished:
            self.finish(req, c.finish_reason or "stop", now)

    def _offset_gap(self, req: Request, c: TokenChunk, aborted: bool, now: float) -> None:
        """The chunk does not continue the tokens held: none of it is kept, and the worker resyncs from them."""
        if c.offset < len(req.tokens):  # positions we already hold were generated a second time
            regenerated = min(len(c.token_ids), len(req.tokens) - c.offset)
            self.tally.tokens_regenerated += regenerated
            metrics.TOKENS_REGENERATED.inc(regenerated)
        metrics.REJECTED_CHUNKS.labels("offset").inc()
        self.tally.tokens_lost += len(c.token_ids)
        metrics.TOKENS_LOST.inc(len(c.token_ids))
        log.warning("chunk offset gap", extra={"request_id": req.id, "offset": c.offset, "held": len(req.tokens)})
        if c.finished or aborted:
            self.migrate(req, MigrationReason.REVOKED, now)
        else:  # resync: continue from the tokens we do hold
            self.leases.revoke(req.id, MigrationReason.REVOKED, now, wire_reason="offset_gap")

    def _refuse_output(self, w: Worker, req: Request, problem: str, now: float) -> None:
        """A chunk the trainer must never see: nothing of it is kept and the request's attempt on `w` failed."""
        metrics.REJECTED_CHUNKS.labels(problem).inc()
        if (w.id, problem) not in self._refusals_logged:  # once per worker and kind: a broken worker floods
            self._refusals_logged.add((w.id, problem))
            log.warning(
                "worker output refused",
                extra={"worker_id": w.id, "request_id": req.id, "problem": problem, "vocab_size": req.vocab_size},
            )
        self.effects.revoke(w.id, MigrationReason.INVALID_OUTPUT.value, req.id)
        metrics.REVOKES.labels(MigrationReason.INVALID_OUTPUT.value).inc()
        self.migrate(req, MigrationReason.INVALID_OUTPUT, now)

    def _keep_tokens(self, w: Worker, req: Request, c: TokenChunk) -> None:
        if not req.workers or req.workers[-1] != w.id:
            req.workers.append(w.id)
        req.tokens.extend(c.token_ids)
        req.logprobs.extend(c.logprobs)
        n = len(c.token_ids)
        w.tokens_generated += n
        self.tally.tokens_received += n  # on_chunks updates the per-pool metrics from this, once per batch

    # ---- failures and departures -------------------------------------------------------------------

    def on_request_failed(
        self, worker_id: str, request_id: str, lease_epoch: int, error: str, now: float, invalid_input: bool = False
    ) -> bool:
        """The worker reports that generating the request failed on it. False if the report is stale."""
        w = self.fleet.alive(worker_id, now)
        req = self.book.requests.get(request_id)
        if w is None or req is None or req.worker != w.id or req.lease_epoch != lease_epoch:
            metrics.STALE_CHUNKS.inc()
            return False
        self._failed_on_worker(w, req, error, invalid_input, now)
        return True

    def _failed_on_worker(self, w: Worker, req: Request, error: str, invalid_input: bool, now: float) -> None:
        """A failed attempt (TokenChunk.error on the last, aborted chunk); with `invalid_input` the request's input
        is refused by the model itself, so no other worker is tried: it is reported failed at once."""
        log.warning(
            "worker reported a request failed",
            extra={"worker_id": w.id, "request_id": req.id, "error": error, "invalid_input": invalid_input},
        )
        req.last_error = error
        self.migrate(req, MigrationReason.WORKER_FAILED, now, final=invalid_input)

    def worker_left(self, w: Worker, reason: MigrationReason, now: float) -> int:
        """`w` left (fleet.remove): every request it held migrates with its tokens. Returns how many."""
        self._refusals_logged = {k for k in self._refusals_logged if k[0] != w.id}
        if w.draining and reason is MigrationReason.STREAM_BROKEN:
            reason = MigrationReason.DRAINED
        held = [self.book.requests[rid] for rid in w.running]
        for req in held:
            self.migrate(req, reason, now, source=w)
        self.costs.worker_done(w, now, left=True)
        return len(held)

    def expire(self, w: Worker, now: float) -> None:
        """`w` was silent past its lease: its requests migrate (it may take work again once it speaks)."""
        w.expired = True
        metrics.LEASE_EXPIRIES.inc()
        held = [self.book.requests[rid] for rid in w.running]
        log.warning("lease expired", extra={"worker_id": w.id, "requests": len(held)})
        if held:  # if it is a zombie rather than dead, tell it to stop
            self.effects.box(w.id).revoke.setdefault("lease_expired", []).extend(r.id for r in held)
        for req in held:
            self.migrate(req, MigrationReason.LEASE_EXPIRED, now, source=w)
        self.costs.worker_done(w, now)

    # ---- leaving the worker ------------------------------------------------------------------------

    def migrate(
        self,
        req: Request,
        reason: MigrationReason,
        now: float,
        final: bool = False,
        source: Worker | None = None,
        flushed: bool = False,
    ) -> None:
        """Back to pending with every token received, first in line; or finished if nothing is left. A failed
        attempt past rollout.maxRequestAttempts (or `final`) reports the request failed instead. `source`: the
        worker it leaves, where a preemption's cost is counted (preemption_costs.py); `flushed`: by its last chunk."""
        worker = req.worker
        if source is not None:
            self.costs.handed_back(source, req, reason, now, flushed)
        if worker is not None:
            self.leases.release(req, now)
        self.tally.migrations += 1
        self.tally.migrations_by_reason[reason.value] += 1
        metrics.MIGRATIONS.labels(reason.value).inc()
        if reason in FAILED_ATTEMPT:
            req.failed_attempts += 1
            if worker is not None:
                req.failed_on.add(worker)
            if final or req.failed_attempts >= self.policy.max_attempts:
                self.give_up(req, reason, now)
                return
        done = finish_reason_if_done(req.tokens, req.sampling)
        if done is not None:
            self.finish(req, done, now)
            return
        if req.next_version is not None:  # carried into a later step: its flush is in, it goes on under that version
            switch_version(req)
        req.phase, req.pending_since = Phase.PENDING, now
        self.book.requeue(req)

    def give_up(self, req: Request, reason: MigrationReason, now: float) -> None:
        """The request used up rollout.maxRequestAttempts: drop it (delivered as 'failed') or fail its step."""
        self.tally.failed_requests += 1
        self.costs.forget(req.id, now)
        metrics.FAILED_REQUESTS.labels(reason.value).inc()
        why = (
            f"request {req.id} failed {req.failed_attempts} attempts (rollout.maxRequestAttempts); last: {reason.value}"
            + (f" ({req.last_error})" if req.last_error else "")
        )
        log.warning(
            "request failed",
            extra={
                "request_id": req.id,
                "attempts": req.failed_attempts,
                "reason": reason.value,
                "dropped": self.policy.drop_failed,
            },
        )
        if self.policy.drop_failed:
            self.finish(req, "failed", now)
            return
        self.book.requests.pop(req.id, None)
        self.carry.forget(req.id)
        self.book.steps.get(req.stream_step, set()).discard(req.id)
        self.effects.fail_step(req.stream_step, why)
        self.effects.dirty = True

    def finish(self, req: Request, reason: str, now: float) -> None:
        """The response is complete: delivered (through the carry-over: a carried one may wait for its next step;
        a model turn of an agentic episode goes back to its env-runner)."""
        self.speed.note_length(req)
        self.costs.forget(req.id, now)
        last = req.worker
        if req.worker is not None:
            self.leases.release(req, now)
        req.phase = Phase.FINISHED
        if not req.workers and last:
            req.workers.append(last)
        oldest, spans = version_spans(req)
        deliver = self.effects.turn_done if req.episode is not None else functools.partial(self.carry.deliver, req)
        deliver(
            Trajectory(
                request_id=req.id,
                step=req.step,
                prompt_index=req.prompt_index,
                sample_index=req.sample_index,
                prompt_ids=req.prompt,
                response_ids=req.tokens,
                logprobs=req.logprobs,
                finish_reason=reason,
                weight_version=oldest,
                workers=req.workers,
                version_spans=spans,
            )
        )
        self.book.requests.pop(req.id, None)
        self.book.close(req)
        self.tally.finished += 1
        metrics.TRAJECTORIES.inc()
        self.effects.dirty = True
