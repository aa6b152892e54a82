"""Length-aware offload: which reserved requests move to which spot worker when the offload window elapses.

Under a long-tailed (lognormal) length distribution the responses that have generated the most so far are
the ones with the most left to generate. So at the window the longest-running requests move first, each to
the spot worker with the smallest batch (a small batch decodes each token fastest: decode is memory-bound),
round-robin so the tail is spread one-by-one over the spot pool instead of piling on one worker. Requests
that find no free spot slot stay unassigned (None): they wait as pending and are placed as slots free up.
The reserved pool is never a target: after the window its GPUs train.

Pure: no clock, no I/O. Used by the rollout-manager's offload controller and by `rlboost simulate`.

    plan = plan_offload([OffloadCandidate("r1", 900), OffloadCandidate("r2", 30)], [WorkerLoad("s1", 3, 8)])
    # [("r1", "s1"), ("r2", "s1")]
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from rlboost.policies.placement import WorkerLoad


@dataclass(frozen=True, slots=True)
class OffloadCandidate:
    """A request running on a reserved worker when the window elapses."""

    request_id: str
    tokens: int  # response tokens generated so far


def longest_first(candidates: Sequence[OffloadCandidate]) -> list[OffloadCandidate]:
    """Candidates in migration order: most tokens first, ties on the id (deterministic)."""
    return sorted(candidates, key=lambda c: (-c.tokens, c.request_id))


def plan_offload(candidates: Sequence[OffloadCandidate], spot: Sequence[WorkerLoad]) -> list[tuple[str, str | None]]:
    """(request id, spot worker id or None) for every candidate, longest first.

    Each request goes to the spot worker with the fewest running requests relative to its capacity at that
    moment (least loaded, ties on the id), so the longest requests land in the smallest batches, one per
    worker before any worker gets a second. None: no spot slot free, the request waits as pending.
    """
    heap = [(w.running / w.capacity, w.worker_id, w.running, w.capacity) for w in spot if w.running < w.capacity]
    heapq.heapify(heap)
    plan: list[tuple[str, str | None]] = []
    for c in longest_first(candidates):
        if not heap:
            plan.append((c.request_id, None))
            continue
        _, wid, running, capacity = heapq.heappop(heap)
        plan.append((c.request_id, wid))
        if running + 1 < capacity:
            heapq.heappush(heap, ((running + 1) / capacity, wid, running + 1, capacity))
    return plan
