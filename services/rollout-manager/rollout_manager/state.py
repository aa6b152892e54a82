"""The rollout-manager's state machine: workers, requests, leases. No network, no asyncio, no clock.

Every method takes `now` (monotonic seconds) and mutates the state; what must go on the wire is
collected as effects the server takes afterwards: per-worker `Outbox`es (batched assign / revoke /
drain / set-version) and finished `Trajectory`s. Per-chunk work is O(1) dict operations; a scheduling
pass is O(W log W + n) and runs only when something that frees or needs capacity happened (`dirty`).

A request: PENDING -> RUNNING on a worker under a lease (lease_epoch += 1 on every assignment)
-> FINISHED; or RUNNING -> REVOKING (the worker was asked to stop and flush) -> PENDING again with
every token received, continued elsewhere from exactly there. Chunks whose (worker, lease_epoch)
is not the request's current lease are stale and discarded, so a zombie never duplicates tokens.

A restarted manager knows nothing: workers re-register reporting the responses they hold (`on_held`), kept as
orphans until the trainer re-attaches to their step (`add_step` with the ids it already received); then each
orphan is adopted with its tokens (continued from there, or finished) and the rest of the step runs afresh.

`ManagerState` is one object (one set of bookkeeping, set up in its `__init__`), written in four files: this one
(workers, steps, chunks, transitions, scheduling, status), speed_placement.py (speed-aware placement and
rebalance), carry_over.py (partial-rollout carry-over) and adoption.py (held responses after a restart), whose
mixins it inherits. The records they share (`Request`, `Worker`, `Phase`) are in records.py.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rlboost.policies.balancing import BalanceWorker, HeldRequest, plan_rebalance
from rlboost.policies.migration import FAILED_ATTEMPT, MigrationReason, continuation, finish_reason_if_done
from rlboost.policies.placement import VersionView, WorkerLoad, place, version_moves
from rlboost.policies.speed_rebalance import MAX_MOVES, MIGRATION_COST_S
from rlboost.spec import MAX_GROUP_SIZE, MAX_NEW_TOKENS, RolloutSpec
from rlboost.wire.rollout_io import (
    Assignment,
    ManagerStatus,
    Pool,
    RolloutRequest,
    SamplingParams,
    TokenBounds,
    TokenChunk,
    Trajectory,
    WorkerRegistration,
    WorkerStatus,
    request_id,
    sample_seed,
)

from . import metrics
from .adoption import HeldResponses, Orphan
from .carry_over import CarryOver, _switch_version, _version_spans
from .records import MAX_LOGPROB, MIN_LOGPROB, Phase, Request, Worker, invalid_output
from .speed_placement import SpeedPlacement

log = logging.getLogger(__name__)


@functools.cache
def _tokens_received(pool: str):
    """The pool's labelled token counter; `labels()` costs more than the increment on the per-chunk path."""
    return metrics.TOKENS_RECEIVED.labels(pool)


class StepError(ValueError):
    """A Rollout call that cannot be accepted; the message names the field."""


# Lease epochs of dropped requests kept for a step sent again (cancel_step): the newest this many. A restarted
# trainer re-sends the step it was on, a few thousand ids at most; a step never sent again ages out.
MAX_DROPPED_EPOCHS = 65_536


@dataclass(frozen=True)
class RequestPolicy:
    """Bounds on a step's requests and what happens when one keeps failing (the job spec's rollout fields)."""

    max_prompt_tokens: int = 131072
    max_step_requests: int = 1 << 20
    max_attempts: int = 5  # failed attempts (FAILED_ATTEMPT reasons) before the request is reported failed
    drop_failed: bool = False  # True: deliver a failed request as finish_reason "failed"; False: fail its step
    stall_timeout_s: float = 120.0  # a running request with no token for this long is revoked
    speed_migration_cost_s: float = MIGRATION_COST_S  # what a speed-rebalance move is expected to cost (s)
    speed_rebalance_moves: int = MAX_MOVES  # most speed-rebalance moves per balancing pass (0: off)

    @classmethod
    def from_spec(cls, r: RolloutSpec) -> RequestPolicy:
        return cls(
            max_prompt_tokens=r.max_prompt_tokens,
            max_step_requests=r.max_step_requests,
            max_attempts=r.max_request_attempts,
            drop_failed=r.on_failed_request == "drop",
            stall_timeout_s=r.request_stall_timeout_ms / 1000,
            speed_migration_cost_s=r.speed_rebalance_migration_cost_s,
            speed_rebalance_moves=r.speed_rebalance_max_moves,
        )


@dataclass
class Outbox:
    """Commands for one worker, batched until the server flushes them."""

    assign: list[Assignment] = field(default_factory=list)
    revoke: dict[str, list[str]] = field(default_factory=dict)  # reason -> request ids
    drain: str | None = None
    set_version: int | None = None


class ManagerState(SpeedPlacement, CarryOver, HeldResponses):
    """All scheduling state of one manager. Single-threaded: call from one asyncio loop."""

    def __init__(
        self,
        lease_timeout_s: float,
        revoke_timeout_s: float | None = None,
        balance_min_excess: int = 2,
        policy: RequestPolicy | None = None,
        orphan_ttl_s: float = 300.0,
        speed_aware: bool = True,
    ):
        """`speed_aware`: place by measured worker speed (placement.place_by_speed); False: least-loaded only."""
        self.policy = policy or RequestPolicy()
        self.orphan_ttl_s = orphan_ttl_s  # held responses of a step nobody re-attaches to are forgotten after this
        self._orphans: dict[str, Orphan] = {}  # request id -> a held response waiting for its step
        self.adopted = 0  # held responses adopted with their tokens
        self.lease_timeout_s = lease_timeout_s
        self.revoke_timeout_s = revoke_timeout_s if revoke_timeout_s is not None else lease_timeout_s
        self.balance_min_excess = balance_min_excess
        self.workers: dict[str, Worker] = {}
        # Workers with a free slot: a scheduling pass looks at these only, not at every worker (1,000 of them,
        # nearly all full, with a pass after every finished request). Kept by register/_assign/_release/remove_worker.
        self._free: dict[str, None] = {}
        self._worker_versions: Counter[int] = Counter()  # version -> workers holding it (any state)
        self._registrations = 0
        self.requests: dict[str, Request] = {}
        self._pending: dict[int, deque[str]] = {}  # version -> ids (may hold stale ids; skipped)
        self._pending_count: Counter[int] = Counter()  # version -> exact number pending
        self._held_count: Counter[int] = Counter()  # version -> running + revoking
        self._revoking: set[str] = set()
        self._steps: dict[int, set[str]] = {}  # step -> ids not yet delivered
        self._outbox: dict[str, Outbox] = {}
        self._delivered: list[Trajectory] = []
        self._failed_steps: dict[int, str] = {}  # step -> why (a request failed its attempts; policy: fail)
        self._refusals_logged: set[tuple[str, str]] = set()  # (worker, problem): invalid output is logged once
        self._next_stall_check = 0.0
        self.failed_requests = 0
        self.offloaded_pools: set[Pool] = set()  # pools the offload window stopped (their GPUs train): no new work
        self.dirty = False
        self.finished = 0
        self.migrations = 0
        self.migrations_by_reason: Counter[str] = Counter()
        self.tokens_received = 0
        self.tokens_lost = 0  # received but not kept (offset gaps)
        self.tokens_regenerated = 0  # received again for positions already held
        self._pool_tokens: Counter[str] = Counter()  # tokens received per pool (for the tokens/s gauge)
        self._rate_mark: tuple[float, Counter[str]] | None = None
        # Seconds each pool's workers held at least one request, of busy spells that ended (open spells are added
        # at status time): kept on assign/release, not per token, so the spot scaler's busy share costs nothing.
        self._busy_s: Counter[str] = Counter()
        self.speed_aware = speed_aware
        self._dropped_epochs: dict[str, int] = {}  # request id -> last lease epoch, of requests of cancelled steps
        # step -> prompt index (-1: the whole step) -> (tokens, responses) of finished responses: the length prior
        self._finished_lengths: dict[int, dict[int, tuple[int, int]]] = {}
        # Speed-aware rebalance: request id -> the faster worker it was revoked for (its slot waits for it), and
        # the seconds a move is expected to cost (revoke round trip and re-prefill of prompt + generated tokens),
        # and the most moves per balancing pass (0: off)
        self._speed_targets: dict[str, str] = {}
        self.speed_migration_cost_s = self.policy.speed_migration_cost_s
        self.speed_rebalance_moves = self.policy.speed_rebalance_moves
        # Partial rollout: requests of a step whose stream ended at its target, kept for the next step (running
        # on under their version meanwhile); those that finished meanwhile; the stream a re-homed one goes to.
        self._carried: dict[str, Request] = {}
        self._carried_done: dict[str, Trajectory] = {}
        self._delivered_to: dict[str, int] = {}
        self.carried_total = 0  # requests carried into a later step, since start

    # ---- effects -----------------------------------------------------------------------------------

    def _box(self, worker_id: str) -> Outbox:
        box = self._outbox.get(worker_id)
        if box is None:
            box = self._outbox[worker_id] = Outbox()
        return box

    def take_outbox(self) -> dict[str, Outbox]:
        out, self._outbox = self._outbox, {}
        return out

    def take_delivered(self) -> list[Trajectory]:
        out, self._delivered = self._delivered, []
        return out

    def take_failed_steps(self) -> dict[int, str]:
        """Steps that failed (a request used up its attempts and the policy is to fail), with why."""
        out, self._failed_steps = self._failed_steps, {}
        return out

    # ---- workers -----------------------------------------------------------------------------------

    def register(self, reg: WorkerRegistration, now: float) -> None:
        """A worker joined (or re-joined under the same id: its old incarnation's requests migrate)."""
        if reg.worker_id in self.workers:
            self.remove_worker(reg.worker_id, MigrationReason.STREAM_BROKEN, now)
        self._registrations += 1
        w = Worker(reg=reg, version=reg.weight_version, last_seen=now, seq=self._registrations)
        self.workers[reg.worker_id] = w
        self._free[reg.worker_id] = None
        self._worker_versions[w.version] += 1
        self.dirty = True

    def remove_worker(self, worker_id: str, reason: MigrationReason, now: float) -> int:
        """The worker's stream ended: every request it held migrates with its tokens. Returns how many."""
        w = self.workers.pop(worker_id, None)
        if w is not None:
            self._end_busy(w, now)
        self._outbox.pop(worker_id, None)
        if w is None:
            return 0
        self._refusals_logged = {k for k in self._refusals_logged if k[0] != worker_id}
        if w.draining and reason is MigrationReason.STREAM_BROKEN:
            reason = MigrationReason.DRAINED
        held = [self.requests[rid] for rid in w.running]
        for req in held:
            self._migrate(req, reason, now)
        self._free.pop(worker_id, None)
        self._worker_versions[w.version] -= 1
        self.dirty = True
        return len(held)

    def on_heartbeat(self, worker_id: str, weight_version: int, now: float, memory_released: bool = False) -> None:
        w = self._alive(worker_id, now)
        if w is not None:
            self._observe_sync(w, weight_version, now)
            self._set_version(w, weight_version)
            if w.memory_released != memory_released:
                w.memory_released = memory_released
                self.dirty = self.dirty or not memory_released  # a resumed worker's capacity is free again

    def on_weight_version(self, worker_id: str, weight_version: int, now: float) -> None:
        w = self._alive(worker_id, now)
        if w is not None:
            self._observe_sync(w, weight_version, now)
            self._set_version(w, weight_version)

    def on_drain_notice(self, worker_id: str, now: float) -> None:
        """The worker announced it is going away (SIGTERM): no new work; its requests migrate when it stops."""
        w = self._alive(worker_id, now)
        if w is not None:
            w.draining = True

    def drain(self, node: str, worker_ids: list[str], reason: str) -> list[str]:
        """A preemption notice: mark matching workers draining and send them DrainCommand. Returns their ids."""
        wanted = set(worker_ids)
        matched = [w for w in self.workers.values() if w.id in wanted or (node and w.reg.node == node)]
        for w in matched:
            if not w.draining:
                w.draining = True
                self._box(w.id).drain = reason or "preemption"
        return [w.id for w in matched]

    def _alive(self, worker_id: str, now: float) -> Worker | None:
        w = self.workers.get(worker_id)
        if w is not None:
            w.last_seen = now
            if w.expired:  # a worker that went silent is back: it may take work again
                w.expired = False
                self.dirty = True
        return w

    def _set_version(self, w: Worker, version: int) -> None:
        if version != w.version:
            self._worker_versions[w.version] -= 1
            self._worker_versions[version] += 1
            w.version = version
            self.dirty = True

    # ---- steps -------------------------------------------------------------------------------------

    def add_step(self, r: RolloutRequest, now: float) -> int:
        """Expand prompts x group_size into pending requests, less those the trainer already received (it
        re-attached), adopting the responses workers hold. Returns how many trajectories the step yields."""
        if r.step in self._steps:
            raise StepError(f"rollout.step: step {r.step} is already being rolled out; wait for it or cancel it")
        self._check_step(r)
        received = set(r.received_request_ids)
        ids: set[str] = set()
        queue = self._pending.setdefault(r.weight_version, deque())
        for p in r.prompts:
            for g in range(r.group_size):
                rid = request_id(r.step, p.prompt_index, g)
                if rid in received:
                    continue
                seed = sample_seed(r.sampling.seed, r.step, p.prompt_index, g)
                sampling = SamplingParams(**{**r.sampling.__dict__, "seed": seed})
                self.requests[rid] = Request(
                    id=rid,
                    step=r.step,
                    prompt_index=p.prompt_index,
                    sample_index=g,
                    prompt=list(p.token_ids),
                    sampling=sampling,
                    weight_version=r.weight_version,
                    lease_epoch=self._dropped_epochs.pop(rid, 0),  # an id sent again: its leases go on
                    pending_since=now,
                    vocab_size=r.vocab_size,
                )
                queue.append(rid)
                ids.add(rid)
        total = len(ids)
        self._pending_count[r.weight_version] += total
        total += self._continue_carried(r, ids, received, now)  # partial rollout: earlier steps' samples
        if ids:
            self._steps[r.step] = ids  # the same set: adopted responses that finished leave it below
        for rid in [rid for rid in ids if rid in self._orphans]:
            orphan = self._orphans.pop(rid)
            self._adopt(self.requests[rid], orphan.held, orphan.worker, now)
        self.dirty = True
        return total

    def _check_step(self, r: RolloutRequest) -> None:
        """Bounds on one Rollout call, checked before it costs anything; StepError names the field."""
        p = self.policy
        if r.group_size > MAX_GROUP_SIZE:
            raise StepError(f"rollout.group_size: {r.group_size} is over the limit of {MAX_GROUP_SIZE}")
        if len(r.prompts) * r.group_size > p.max_step_requests:
            raise StepError(
                f"rollout.prompts: {len(r.prompts)} prompts x group_size {r.group_size} is over the limit of "
                f"{p.max_step_requests} requests per step (rollout.maxStepRequests)"
            )
        if r.sampling.max_new_tokens > MAX_NEW_TOKENS:
            raise StepError(
                f"sampling.max_new_tokens: {r.sampling.max_new_tokens} is over the limit of {MAX_NEW_TOKENS}"
            )
        if len(r.received_request_ids) > p.max_step_requests:
            raise StepError(
                f"rollout.received_request_ids: {len(r.received_request_ids)} ids is over the limit of "
                f"{p.max_step_requests} requests per step (rollout.maxStepRequests)"
            )
        indices = [q.prompt_index for q in r.prompts]
        if len(set(indices)) != len(indices):
            raise StepError("rollout.prompts: prompt_index values must be unique within a step")
        for q in r.prompts:
            if len(q.token_ids) > p.max_prompt_tokens:
                raise StepError(
                    f"rollout.prompts[{q.prompt_index}]: {len(q.token_ids)} tokens is over the limit of "
                    f"{p.max_prompt_tokens} (rollout.maxPromptTokens)"
                )
            if min(q.token_ids) < 0 or (r.vocab_size and max(q.token_ids) >= r.vocab_size):
                raise StepError(
                    f"rollout.prompts[{q.prompt_index}]: token ids must lie in [0, vocab_size={r.vocab_size})"
                )

    def cancel_step(self, step: int, now: float | None = None) -> int:
        """The trainer went away: drop the step's requests, revoking the running ones. Returns how many."""
        ids = self._steps.pop(step, set())
        for rid in ids:
            self._drop_request(rid, now)
        self.dirty = True
        return len(ids)

    def _drop_request(self, rid: str, now: float | None) -> None:
        """Forget a request nobody waits for any more, revoking it from its worker."""
        req = self.requests.pop(rid, None)
        if req is None:
            return
        # A trainer that comes back sends this step again, with the same ids: their leases must not start over,
        # or a late chunk of this incarnation (same worker, same epoch) would pass as one of the next.
        self._dropped_epochs.pop(rid, None)  # re-inserted at the end: the dict's order is the drops' order
        self._dropped_epochs[rid] = req.lease_epoch
        if len(self._dropped_epochs) > MAX_DROPPED_EPOCHS:  # bounded: the oldest drop is forgotten
            del self._dropped_epochs[next(iter(self._dropped_epochs))]
        if req.phase is Phase.PENDING:
            self._pending_count[req.weight_version] -= 1
        elif req.worker is not None:
            self._box(req.worker).revoke.setdefault("cancelled", []).append(rid)
            self._release(req, now)
            metrics.REVOKES.labels("cancelled").inc()

    # ---- chunks ------------------------------------------------------------------------------------

    def on_chunks(
        self, worker_id: str, chunks: list[TokenChunk], now: float, bounds: TokenBounds | None = None
    ) -> None:
        """One worker's batch of chunks. `bounds`: the extremes of every token in the batch (computed once for the
        batch): when they lie within the bounds no chunk needs its own pass; without them each chunk is checked."""
        w = self._alive(worker_id, now)
        if w is None:
            metrics.STALE_CHUNKS.inc(len(chunks))
            return
        # the batch's token ids are checked against each request's vocabulary (a comparison per chunk)
        max_id = (
            bounds.max_token_id
            if bounds and MIN_LOGPROB <= bounds.min_logprob <= bounds.max_logprob <= MAX_LOGPROB
            else None
        )
        before = self.tokens_received
        for c in chunks:
            self._on_chunk(w, c, now, max_id)
        if n := self.tokens_received - before:  # metrics once per batch: a labelled inc() costs more than a chunk
            pool = w.reg.pool.value
            self._pool_tokens[pool] += n
            _tokens_received(pool).inc(n)

    def _on_chunk(self, w: Worker, c: TokenChunk, now: float, max_id: int | None = None) -> None:
        """`max_id`: the largest token id of the chunk's batch, whose log-probs are known to be in range (None:
        unknown, check the chunk alone)."""
        req = self.requests.get(c.request_id)
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
            if c.offset < len(req.tokens):  # positions we already hold were generated a second time
                regenerated = min(len(c.token_ids), len(req.tokens) - c.offset)
                self.tokens_regenerated += regenerated
                metrics.TOKENS_REGENERATED.inc(regenerated)
            metrics.REJECTED_CHUNKS.labels("offset").inc()
            self.tokens_lost += len(c.token_ids)
            metrics.TOKENS_LOST.inc(len(c.token_ids))
            log.warning("chunk offset gap", extra={"request_id": req.id, "offset": c.offset, "held": len(req.tokens)})
            if c.finished or aborted:
                self._migrate(req, MigrationReason.REVOKED, now)
            else:  # resync: continue from the tokens we do hold
                self.revoke(req.id, MigrationReason.REVOKED, now, wire_reason="offset_gap")
            return
        if c.token_ids:
            req.progress_at = now
            self._keep_tokens(w, req, c)
            budget = req.sampling.max_new_tokens
            if len(req.tokens) > budget:  # never deliver more than the response budget
                del req.tokens[budget:], req.logprobs[budget:]
        if aborted and c.error:  # the request failed on this worker by itself (the others of its batch go on)
            self._failed_on_worker(w, req, c.error, c.invalid_input, now)
        elif aborted:
            self._migrate(req, req.revoke_reason if req.phase is Phase.REVOKING else MigrationReason.DRAINED, now)
        elif len(req.tokens) >= req.sampling.max_new_tokens and not c.finished:
            self._finish(req, "length", now)
        elif c.finished:
            self._finish(req, c.finish_reason or "stop", now)

    def _refuse_output(self, w: Worker, req: Request, problem: str, now: float) -> None:
        """A chunk the trainer must never see: nothing of it is kept and the request's attempt on `w` failed."""
        metrics.REJECTED_CHUNKS.labels(problem).inc()
        if (w.id, problem) not in self._refusals_logged:  # once per worker and kind: a broken worker floods
            self._refusals_logged.add((w.id, problem))
            log.warning(
                "worker output refused",
                extra={"worker_id": w.id, "request_id": req.id, "problem": problem, "vocab_size": req.vocab_size},
            )
        self._box(w.id).revoke.setdefault(MigrationReason.INVALID_OUTPUT.value, []).append(req.id)
        metrics.REVOKES.labels(MigrationReason.INVALID_OUTPUT.value).inc()
        self._migrate(req, MigrationReason.INVALID_OUTPUT, now)

    def on_request_failed(
        self, worker_id: str, request_id: str, lease_epoch: int, error: str, now: float, invalid_input: bool = False
    ) -> bool:
        """The worker reports that generating the request failed on it. False if the report is stale."""
        w = self._alive(worker_id, now)
        req = self.requests.get(request_id)
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
        self._migrate(req, MigrationReason.WORKER_FAILED, now, final=invalid_input)

    def _keep_tokens(self, w: Worker, req: Request, c: TokenChunk) -> None:
        if not req.workers or req.workers[-1] != w.id:
            req.workers.append(w.id)
        req.tokens.extend(c.token_ids)
        req.logprobs.extend(c.logprobs)
        n = len(c.token_ids)
        w.tokens_generated += n
        self.tokens_received += n  # on_chunks updates the per-pool metrics from this, once per batch

    # ---- transitions -------------------------------------------------------------------------------

    def _assign(self, req: Request, w: Worker, now: float) -> None:
        req.lease_epoch += 1
        req.phase, req.worker, req.assigned_at, req.tokens_at_assign = Phase.RUNNING, w.id, now, len(req.tokens)
        req.progress_at = now
        if not w.running:
            w.busy_since = now
        w.running.add(req.id)
        if len(w.running) >= w.reg.capacity:
            self._free.pop(w.id, None)
        self._pending_count[req.weight_version] -= 1
        self._held_count[req.weight_version] += 1
        input_ids, prompt_len = continuation(req.prompt, list(req.tokens))
        self._box(w.id).assign.append(
            Assignment(
                req.id, req.lease_epoch, input_ids, prompt_len, req.sampling, req.weight_version, list(req.logprobs)
            )
        )
        metrics.ASSIGNMENTS.inc()
        metrics.ASSIGN_LATENCY.observe(max(0.0, now - req.pending_since))

    def _release(self, req: Request, now: float | None) -> None:
        """Take the request off its worker (no lease any more: its chunks become stale). `now`: None when the
        caller has no clock (a cancelled step): the busy spell it ends is not counted."""
        w = self.workers.get(req.worker) if req.worker else None
        if w is not None:
            self._observe_rate(w, req, now)
            w.running.discard(req.id)
            if not w.running:
                self._end_busy(w, now)
            if len(w.running) < w.reg.capacity:
                self._free[w.id] = None
        self._held_count[req.weight_version] -= 1
        self._revoking.discard(req.id)
        req.worker = None
        self.dirty = True

    def _migrate(self, req: Request, reason: MigrationReason, now: float, final: bool = False) -> None:
        """Back to pending with every token received, first in line; or finished if nothing is left. A failed
        attempt past rollout.maxRequestAttempts (or `final`) reports the request failed instead."""
        worker = req.worker
        if worker is not None:
            self._release(req, now)
        self.migrations += 1
        self.migrations_by_reason[reason.value] += 1
        metrics.MIGRATIONS.labels(reason.value).inc()
        if reason in FAILED_ATTEMPT:
            req.failed_attempts += 1
            if worker is not None:
                req.failed_on.add(worker)
            if final or req.failed_attempts >= self.policy.max_attempts:
                self._give_up(req, reason, now)
                return
        done = finish_reason_if_done(req.tokens, req.sampling)
        if done is not None:
            self._finish(req, done, now)
            return
        if req.next_version is not None:  # carried into a later step: its flush is in, it goes on under that version
            _switch_version(req)
        req.phase, req.pending_since = Phase.PENDING, now
        self._pending.setdefault(req.weight_version, deque()).appendleft(req.id)
        self._pending_count[req.weight_version] += 1

    def _give_up(self, req: Request, reason: MigrationReason, now: float) -> None:
        """The request used up rollout.maxRequestAttempts: drop it (delivered as 'failed') or fail its step."""
        self.failed_requests += 1
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
            self._finish(req, "failed", now)
            return
        self.requests.pop(req.id, None)
        self._carried.pop(req.id, None)
        self._steps.get(req.stream_step, set()).discard(req.id)
        self._failed_steps.setdefault(req.stream_step, why)
        self.dirty = True

    def _finish(self, req: Request, reason: str, now: float) -> None:
        self._note_length(req)
        last = req.worker
        if req.worker is not None:
            self._release(req, now)
        req.phase = Phase.FINISHED
        if not req.workers and last:
            req.workers.append(last)
        oldest, spans = _version_spans(req)
        self._deliver(
            req,
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
            ),
        )
        self.requests.pop(req.id, None)
        self._steps.get(req.stream_step, set()).discard(req.id)
        if not self._steps.get(req.stream_step, True):
            del self._steps[req.stream_step]
        self.finished += 1
        metrics.TRAJECTORIES.inc()
        self.dirty = True

    def revoke(self, rid: str, reason: MigrationReason, now: float, wire_reason: str | None = None) -> bool:
        """Ask the worker to stop the request and flush; it migrates on the flush or at the deadline."""
        req = self.requests.get(rid)
        if req is None or req.phase is not Phase.RUNNING or req.worker is None:
            return False
        req.phase, req.revoke_reason = Phase.REVOKING, reason
        req.revoke_deadline = now + self.revoke_timeout_s
        self._revoking.add(rid)
        label = wire_reason or reason.value
        self._box(req.worker).revoke.setdefault(label, []).append(rid)
        metrics.REVOKES.labels(label).inc()
        return True

    # ---- periodic ----------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Lease expiry and revoke deadlines; call a few times per heartbeat interval."""
        for w in self.workers.values():
            if not w.expired and now - w.last_seen > self.lease_timeout_s:
                self._expire(w, now)
        late = [rid for rid in self._revoking if self.requests[rid].revoke_deadline <= now]
        for rid in late:  # the worker never flushed: the epoch fences whatever it still sends
            req = self.requests[rid]
            self._migrate(req, req.revoke_reason, now)
        if now >= self._next_stall_check:
            self._next_stall_check = now + min(1.0, self.policy.stall_timeout_s / 4)
            self._revoke_stalled(now)
            self._forget_orphans(now)
        self._update_gauges(now)

    def _revoke_stalled(self, now: float) -> int:
        """Revoke running requests that got no token for the stall timeout, even from a heartbeating worker."""
        limit = self.policy.stall_timeout_s
        stalled = [
            rid
            for w in self.workers.values()
            for rid in w.running
            if self.requests[rid].phase is Phase.RUNNING and now - self.requests[rid].progress_at > limit
        ]
        for rid in stalled:
            log.warning("request stalled", extra={"request_id": rid, "worker_id": self.requests[rid].worker})
            self.revoke(rid, MigrationReason.STALLED, now)
        return len(stalled)

    def _expire(self, w: Worker, now: float) -> None:
        w.expired = True
        metrics.LEASE_EXPIRIES.inc()
        held = [self.requests[rid] for rid in w.running]
        log.warning("lease expired", extra={"worker_id": w.id, "requests": len(held)})
        if held:  # if it is a zombie rather than dead, tell it to stop
            self._box(w.id).revoke.setdefault("lease_expired", []).extend(r.id for r in held)
        for req in held:
            self._migrate(req, MigrationReason.LEASE_EXPIRED, now)

    def balance(self, now: float) -> int:
        """Revoke excess requests from overloaded workers when others sit idle. Returns how many."""
        groups: dict[int, list[Worker]] = {}
        for w in self.workers.values():
            if self._schedulable(w):
                groups.setdefault(w.version, []).append(w)
        moved = 0
        for version, members in groups.items():
            if self._pending_count[version] > 0 or len(members) < 2:
                continue  # plan_rebalance moves nothing then: skip building a view of every running request
            speed_rebalance = self.speed_aware and self.speed_rebalance_moves > 0
            for peers in self._speed_peers(members) if speed_rebalance else [members]:
                views = [
                    BalanceWorker(
                        w.id,
                        w.reg.capacity,
                        [self._held_view(rid, now) for rid in w.running if self.requests[rid].phase is Phase.RUNNING],
                    )
                    for w in peers
                ]
                plan = plan_rebalance(views, self._pending_count[version], self.balance_min_excess)
                for ids in plan.values():
                    moved += sum(self.revoke(rid, MigrationReason.REBALANCE, now) for rid in ids)
            if speed_rebalance:
                moved += self._speed_rebalance(members, now)
        return moved

    def _held_view(self, rid: str, now: float) -> HeldRequest:
        req = self.requests[rid]
        return HeldRequest(rid, len(req.tokens), now - req.assigned_at)

    def capacity_by_pool(self) -> dict[Pool, int]:
        out = {Pool.RESERVED: 0, Pool.SPOT: 0}
        for w in self.workers.values():
            if w.eligible:
                out[w.reg.pool] += w.reg.capacity
        return out

    # ---- scheduling --------------------------------------------------------------------------------

    def schedule(self, now: float) -> int:
        """Place pending work and move idle workers to newer weight versions. Returns assignments made.

        Only workers with a free slot are looked at (a full one can take nothing), so a pass costs
        O(free workers), not O(workers)."""
        self.dirty = False
        if not any(c > 0 for c in self._pending_count.values()):
            return 0  # nothing to place, and no version to move anyone to
        pinned = self._place_speed_targets(now) if self._speed_targets else 0
        free = sorted((self.workers[wid] for wid in self._free), key=lambda w: w.seq)
        by_version: dict[int, list[Worker]] = {}
        for w in free:
            if self._schedulable(w):
                by_version.setdefault(w.version, []).append(w)
        made = 0
        for version, count in list(self._pending_count.items()):
            if count <= 0 or version not in by_version:
                continue
            members = {w.id: w for w in by_version[version]}
            version_workers = functools.cache(functools.partial(self._schedulable_at, version))
            queue = self._pending[version]
            if self.speed_aware and any(w.tokens_per_s > 0 for w in members.values()):
                made += self._place_by_speed(queue, count, members, now, version_workers)
            else:
                targets = place(count, (WorkerLoad(w.id, len(w.running), w.reg.capacity) for w in members.values()))
                for wid in targets:
                    req = self._pop_pending(queue, wid, version_workers)
                    if req is None:
                        if not queue:
                            break
                        continue  # what is left failed on this worker: another may take it below
                    self._assign(req, members[wid], now)
                    made += 1
            if self._pending_count[version] > 0 and queue:
                made += self._fill_free_slots(queue, members.values(), now, version_workers)
        self._push_versions(now)
        return made + pinned

    def _schedulable_at(self, version: int) -> int:
        """Schedulable workers holding `version`, busy or not (O(workers): only for requests that failed)."""
        return sum(1 for w in self.workers.values() if w.version == version and self._schedulable(w))

    def _schedulable(self, w: Worker) -> bool:
        return w.eligible and w.reg.pool not in self.offloaded_pools

    def set_pool_offloaded(self, pool: Pool, offloaded: bool) -> None:
        """Stop (or resume) giving a pool new work: reserved workers once the offload window elapsed."""
        if offloaded:
            self.offloaded_pools.add(pool)
        else:
            self.offloaded_pools.discard(pool)
        self.dirty = True

    def idle_slots(self, pool: Pool) -> int:
        """Free request slots of a pool's schedulable workers."""
        return sum(
            w.reg.capacity - len(w.running)
            for w in self.workers.values()
            if w.reg.pool is pool and self._schedulable(w)
        )

    def _fill_free_slots(
        self, queue: deque[str], members: Iterable[Worker], now: float, version_workers: Callable[[], int]
    ) -> int:
        """Requests `place` aimed at a worker they failed on go to any other worker with a free slot."""
        made = 0
        for w in members:
            while len(w.running) < w.reg.capacity and (req := self._pop_pending(queue, w.id, version_workers)):
                self._assign(req, w, now)
                made += 1
        return made

    def _pop_pending(self, queue: deque[str], worker_id: str, workers: Callable[[], int]) -> Request | None:
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

    def _push_versions(self, now: float | None = None) -> None:
        pending = {v for v, c in self._pending_count.items() if c > 0}
        if not pending:
            return
        target = max(pending)
        if not any(n > 0 and v < target for v, n in self._worker_versions.items()):
            return  # every worker holds the newest version (the common case): no pass over the workers
        workers = [w for w in self.workers.values() if self._schedulable(w)]
        if not any(w.version < target and w.requested_version < target for w in workers):
            return  # nobody would move: skip building a view of every worker
        busy = pending | {v for v, c in self._held_count.items() if c > 0}
        views = [VersionView(w.id, w.version, w.requested_version) for w in workers]
        for wid, version in version_moves(views, pending, busy):
            self.workers[wid].requested_version = version
            self.workers[wid].sync_asked_at = now  # its weight-sync time runs from here (_observe_sync)
            self._box(wid).set_version = version

    # ---- status ------------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return sum(self._pending_count.values())

    @property
    def running(self) -> int:
        return sum(self._held_count.values())

    def has_step(self, step: int) -> bool:
        return step in self._steps

    def status(self, now: float | None = None) -> ManagerStatus:
        """`now`: the clock the state is driven with, for the busy seconds of spells still open (None: omitted)."""
        workers = [
            WorkerStatus(
                worker_id=w.id,
                pool=w.reg.pool,
                node=w.reg.node,
                weight_version=w.version,
                running=len(w.running),
                capacity=w.reg.capacity,
                tokens_generated=w.tokens_generated,
                inflight_tokens=self._inflight_tokens(w),
                draining=w.draining,
                memory_released=w.memory_released,
                tokens_per_s=w.tokens_per_s,
                weight_sync_s=w.sync_s,
            )
            for w in self.workers.values()
        ]
        return ManagerStatus(
            workers=workers,
            pending=self.pending,
            running=self.running,
            finished=self.finished,
            migrations=self.migrations,
            tokens_received=self.tokens_received,
            tokens_lost=self.tokens_lost,
            tokens_regenerated=self.tokens_regenerated,
            migrations_by_reason=dict(self.migrations_by_reason),
            busy_seconds=self.busy_seconds(now) if now is not None else dict(self._busy_s),
        )

    def _end_busy(self, w: Worker, now: float | None) -> None:
        """Close the worker's busy spell (its last request left it, or it left)."""
        if w.busy_since is not None and now is not None:
            self._busy_s[str(w.reg.pool)] += max(0.0, now - w.busy_since)
        w.busy_since = None

    def busy_seconds(self, now: float) -> dict[str, float]:
        """Per pool: seconds its workers (any that ever registered) held at least one request, up to `now`."""
        out = {pool.value: self._busy_s[pool.value] for pool in Pool}
        for w in self.workers.values():
            if w.busy_since is not None:
                out[str(w.reg.pool)] += max(0.0, now - w.busy_since)
        return out

    def _inflight_tokens(self, w: Worker) -> int:
        """Tokens `w` streamed of responses it is still generating: what its death now would hand over."""
        held = (self.requests[rid] for rid in w.running)
        return sum(len(r.tokens) - r.tokens_at_assign for r in held if r.phase is Phase.RUNNING)

    def _update_gauges(self, now: float) -> None:
        mark = self._rate_mark
        if mark is None or now - mark[0] >= 1.0:  # tokens/s per pool over the last second or so
            if mark is not None:
                for pool in Pool:
                    rate = (self._pool_tokens[pool.value] - mark[1][pool.value]) / (now - mark[0])
                    metrics.TOKENS_PER_S.labels(pool.value).set(rate)
            self._rate_mark = (now, Counter(self._pool_tokens))
        pools = Counter(w.reg.pool.value for w in self.workers.values())
        released = Counter(w.reg.pool.value for w in self.workers.values() if w.memory_released)
        for pool in Pool:
            metrics.WORKERS.labels(pool.value).set(pools.get(pool.value, 0))
            metrics.WORKERS_MEMORY_RELEASED.labels(pool.value).set(released.get(pool.value, 0))
        metrics.QUEUE_DEPTH.labels("pending").set(self.pending)
        metrics.QUEUE_DEPTH.labels("running").set(self.running)
