"""A worker's measured speed (issue 16): its decode rate and its weight-sync time, EWMAs folded into its `Worker`
record as requests leave it and as it reports holding a new version. Speed-aware placement (speed_placement.py)
reads them; GetStatus reports them.
"""

from __future__ import annotations

from . import metrics
from .records import Request, Worker

# A worker's decode rate and sync time are EWMAs with this weight on the newest sample; a request that streamed
# fewer tokens than MIN_RATE_TOKENS on a worker says nothing about its rate.
SPEED_EWMA = 0.2
MIN_RATE_TOKENS = 8


def observe_rate(w: Worker, req: Request, now: float | None) -> None:
    """The request leaves `w`: fold the rate it decoded at there into the worker's EWMA. Not from a worker
    that went silent (its lease expired: the silence is no decode rate) nor from a few tokens (noise)."""
    tokens = len(req.tokens) - req.tokens_at_assign
    if now is None or w.expired or tokens < MIN_RATE_TOKENS or now <= req.assigned_at:
        return
    rate = tokens / (now - req.assigned_at)
    w.tokens_per_s = rate if w.tokens_per_s <= 0 else w.tokens_per_s + SPEED_EWMA * (rate - w.tokens_per_s)
    metrics.REQUEST_DECODE_RATE.labels(w.reg.pool.value).observe(rate)


def observe_sync(w: Worker, version: int, now: float) -> None:
    """`w` reports holding `version`: if that is the one the manager asked it for, its sync time is measured."""
    if w.sync_asked_at is None or version < w.requested_version or version == w.version:
        return
    took = max(0.0, now - w.sync_asked_at)
    w.sync_s = took if w.sync_s <= 0 else w.sync_s + SPEED_EWMA * (took - w.sync_s)
    w.sync_asked_at = None
    metrics.WEIGHT_SYNC.labels(w.reg.pool.value).observe(took)
