"""Continuous balancing: when a worker sits idle while another holds more than its fair share, revoke some.

Conservative by design: it only acts when nothing is pending (pending work goes to idle workers by
placement anyway), only moves a worker's excess above its fair share plus `min_excess - 1`, and never
moves more than the idle workers can take. Requests that have not produced a token yet move first
(cheapest), then the ones that have run longest (the tail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeldRequest:
    request_id: str
    tokens: int  # response tokens received so far
    running_for_s: float  # seconds since it was assigned to this worker


@dataclass(frozen=True, slots=True)
class BalanceWorker:
    """One worker of a weight-version group, with the requests that may be revoked from it."""

    worker_id: str
    capacity: int
    requests: Sequence[HeldRequest]


def plan_rebalance(workers: Sequence[BalanceWorker], pending: int, min_excess: int = 2) -> dict[str, list[str]]:
    """Request ids to revoke, per worker, so they migrate to idle workers of the same group."""
    if pending > 0 or len(workers) < 2:
        return {}
    idle_room = sum(w.capacity for w in workers if not w.requests)
    if idle_room == 0:
        return {}
    total_running = sum(len(w.requests) for w in workers)
    total_capacity = sum(w.capacity for w in workers)
    plan: dict[str, list[str]] = {}
    # most loaded first, so the idle room goes where it helps most
    for w in sorted(workers, key=lambda w: len(w.requests) / w.capacity, reverse=True):
        fair = math.ceil(total_running * w.capacity / total_capacity)
        excess = min(len(w.requests) - fair, idle_room)
        if excess < min_excess:
            continue
        order = sorted(w.requests, key=lambda r: (r.tokens > 0, -r.running_for_s, r.request_id))
        plan[w.worker_id] = [r.request_id for r in order[:excess]]
        idle_room -= excess
        if idle_room <= 0:
            break
    return plan
