"""What each preemption cost, measured where it happens (issue 34): one record per preempted worker, one per request
it moved, as log lines and Prometheus metrics that bench/preemption_bench.py and dashboards read.

A preemption is a worker holding running requests that drains after a notice (`notice`: its SIGTERM's DrainNotice, or the DrainCommand of a
NATS preemption notice) or leaves without one: `silent` (its stream broke) or `expired` (it went quiet with its
connections open, and its lease expired). Per worker:

- `notice_to_drained_s`: notice to the moment its last running request was handed back (notice only);
- `detected_after_s`: a silent or expired death's seconds from the worker's last message to its requests' hand-back (the
  lease timeout for a worker that went silent; about 0 when its stream broke);
- `tokens_streamed`: tokens of its running responses the manager had received from it at the notice (or death);
- `tokens_in_flight`: tokens it had generated of its running responses, received or not: kept + lost (a notice's
  flush sends those it had not streamed yet);
- `tokens_kept`: of its responses, the tokens it generated that the manager keeps (the final flush included);
- `tokens_lost`: tokens it generated and never sent, which the next worker generates again (`tokens_regenerated`
  is the same count): 0 for a request handed back by its flush; for one handed back without a flush (a death, or
  a drain cut short) an estimate: the worker's measured decode rate (before it has one: the request's own rate so
  far) x the seconds since the request's last chunk,
  both capped by the chunk cadence the fleet flushes at (a worker sends a chunk at `chunk_max_tokens` tokens or
  `chunk_max_ms`, so no more can be unsent) and by what the response may still add. The manager cannot count
  tokens that never reached it.

Per request it moved: `resume_s`, the seconds from its hand-back until another worker streamed its next token, and
`stalled_s`, from its last token kept to that next token (a silent death's detection included): slot-seconds the
preemption cost, summed in `rlboost_manager_preemption_stalled_request_seconds_total`.

Per step (the StepReport's `preempted_slot_seconds`): `slot_seconds_lost(now)` is that stall summed since start, the
stalls still open counted up to `now` and a moved request that finishes or is dropped before it resumes counted up
to then, so the difference of two reads is the request-seconds lost between them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rlboost.policies.migration import MigrationReason

from . import metrics
from .records import Request, Worker

log = logging.getLogger("rollout_manager.state")
PREEMPTION_REASONS = frozenset({MigrationReason.STREAM_BROKEN, MigrationReason.LEASE_EXPIRED, MigrationReason.DRAINED})
MAX_TRACKED = 100_000  # moved requests awaiting their next token (each is forgotten when it finishes or is dropped)


@dataclass
class _Preempted:
    """One preempted worker's figures, summed as its requests are handed back."""

    worker_id: str
    pool: str
    kind: str  # notice | silent | expired
    notice_at: float | None
    last_seen: float  # the worker's last message when the record opened (a silent death's detection runs from it)
    tokens_streamed: int = 0
    tokens_kept: int = 0
    lost: float = 0.0
    requests: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Moved:
    """A request a preemption handed back, until its next token."""

    at: float  # handed back
    progress_at: float  # its last token kept before that
    reason: str


class PreemptionCosts:
    """The ledger: notices, hand-backs and resumes; single-threaded like the state that calls it."""

    def __init__(self) -> None:
        self._open: dict[str, _Preempted] = {}  # worker id -> its preemption, until its last request is handed back
        self.moved: dict[str, _Moved] = {}  # request id -> its hand-back, until its next token
        # (chunk_max_tokens, chunk_max_ms / 1000) the workers flush at: at most this much of a response is unsent
        # (0: unknown, no cap). The server sets it from its chunk cadence.
        self.flush_bounds: tuple[int, float] = (0, 0.0)
        self.preemptions = 0  # preempted workers since start (their records closed)
        self._stalled_s = 0.0  # request-seconds of stalls that ended (resumed, or forgotten with a clock)

    def notice(self, w: Worker, requests: dict[str, Request], now: float, source: str) -> None:
        """A drain notice for `w` (`source`: worker = its SIGTERM, manager = a NATS notice): the clock starts."""
        log.info("preemption notice received", extra={"worker_id": w.id, "source": source, "running": len(w.running)})
        if w.id in self._open or not w.running:  # an idle worker's preemption costs nothing, as a silent one's
            return
        p = _Preempted(w.id, w.reg.pool.value, "notice", now, w.last_seen)
        p.tokens_streamed = sum(_streamed(requests[rid]) for rid in w.running if rid in requests)
        self._open[w.id] = p

    def handed_back(self, w: Worker, req: Request, reason: MigrationReason, now: float, flushed: bool) -> None:
        """`req` leaves `w` for `reason` (before its lease is released), `flushed` by the worker's last chunk or
        not; a preemption reason opens a silent record when no notice came first."""
        if reason not in PREEMPTION_REASONS:
            return
        p = self._open.get(w.id)
        if p is None:
            kind = "expired" if reason is MigrationReason.LEASE_EXPIRED else "silent"
            p = self._open[w.id] = _Preempted(w.id, w.reg.pool.value, kind, None, w.last_seen)
        streamed = _streamed(req)
        if p.kind != "notice":
            p.tokens_streamed += streamed
        if not flushed:
            p.lost += self._unsent(w, req, now)
        p.tokens_kept += streamed
        p.requests.append(req.id)
        if len(self.moved) < MAX_TRACKED:
            self.moved[req.id] = _Moved(now, req.progress_at, reason.value)

    def _unsent(self, w: Worker, req: Request, now: float) -> float:
        """Tokens of `req` that `w` generated and never sent, estimated (see the module's docstring)."""
        max_tokens, max_s = self.flush_bounds
        since = max(0.0, now - req.progress_at)
        cap = max(0, req.sampling.max_new_tokens - len(req.tokens))
        if max_tokens:
            cap, since = min(cap, max_tokens), min(since, max_s)
        return min(cap, _rate(w, req) * since)

    def worker_done(self, w: Worker, now: float, left: bool = False) -> None:
        """After hand-backs: `w` holds nothing more, or `left` (its stream ended), so its preemption is complete."""
        if w.id in self._open and (left or not w.running):
            self._close(w.id, now)

    def resumed(self, req: Request, w: Worker, now: float) -> None:
        """`req` got tokens from `w`: if a preemption had moved it, it is producing again."""
        m = self.moved.pop(req.id)
        resume_s, stalled_s = max(0.0, now - m.at), max(0.0, now - m.progress_at)
        metrics.MIGRATION_RESUME_SECONDS.labels(m.reason).observe(resume_s)
        metrics.PREEMPTION_STALLED_SECONDS.inc(stalled_s)
        self._stalled_s += stalled_s
        log.info(
            "moved request resumed",
            extra={
                "request_id": req.id,
                "worker_id": w.id,
                "reason": m.reason,
                "resume_s": round(resume_s, 4),
                "stalled_s": round(stalled_s, 4),
            },
        )

    def forget(self, request_id: str, now: float | None = None) -> None:
        """The request finished, was given up or dropped: it will not resume (its stall until `now` was lost)."""
        m = self.moved.pop(request_id, None)
        if m is not None and now is not None:
            self._stalled_s += max(0.0, now - m.progress_at)

    def slot_seconds_lost(self, now: float | None) -> float:
        """Request-seconds moved requests spent stalled since start, open stalls up to `now` (None: ended ones)."""
        if now is None:
            return self._stalled_s
        return self._stalled_s + sum(max(0.0, now - m.progress_at) for m in self.moved.values())

    def _close(self, worker_id: str, now: float) -> None:
        p = self._open.pop(worker_id)
        drained = None if p.notice_at is None else round(now - p.notice_at, 4)
        detected = round(max(0.0, now - p.last_seen), 4) if p.kind != "notice" else None
        lost = round(p.lost)
        self.preemptions += 1
        metrics.observe_preemption(p.kind, drained, detected, p.tokens_kept, lost)
        log.info(
            "preemption cost",
            extra={
                "worker_id": p.worker_id,
                "pool": p.pool,
                "kind": p.kind,
                "notice_to_drained_s": drained,
                "detected_after_s": detected,
                "requests": len(p.requests),
                "tokens_streamed": p.tokens_streamed,
                "tokens_in_flight": p.tokens_kept + lost,
                "tokens_kept": p.tokens_kept,
                "tokens_lost": lost,
                "request_ids": p.requests,
            },
        )


def _rate(w: Worker, req: Request) -> float:
    """Tokens/s the worker decodes a request at: its measured rate, or (none yet: no request has left it) this
    request's own so far."""
    if w.tokens_per_s > 0:
        return w.tokens_per_s
    took = req.progress_at - req.assigned_at
    return _streamed(req) / took if took > 0 else 0.0


def _streamed(req: Request) -> int:
    """Tokens the request's current worker streamed of it (not those it inherited with a migration)."""
    return max(0, len(req.tokens) - req.tokens_at_assign)
