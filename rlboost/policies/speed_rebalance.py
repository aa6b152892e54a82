"""Speed-aware rebalance: at the end of a step, move the longest-running responses off slow workers to fast idle ones.

Placement (`placement.place_by_speed`) decides where a response goes before its length is known, so some long
responses still land on slow workers and make the step's tail. Once nothing is pending and a faster worker has a
free slot, a response whose expected finish there (remaining tokens / the target's per-request rate + the cost of
moving it: the revoke round trip and re-prefilling prompt + generated tokens) is sooner than staying where it is
moves there, keeping its tokens (token-level migration, `migration.continuation`). Responses that would finish
last move first, each to the least-loaded free worker of the fastest speed band, so the tail spreads one by one
over the fast workers instead of piling on one (which plain balancing would then spread again, to slow ones too). A request never moves to a worker that is not at least
`min_speedup` times faster (EWMAs of equal GPUs differ: no churn between equals), nor from or to a worker whose
rate is not measured yet.

Pure: no clock, no I/O. Used by the rollout-manager's balancing pass and by bench/placement_bench.py.

    plan_speed_rebalance([RunningResponse("r1", "slow", 2000.0)],
                         [WorkerSpeed("slow", 1, 8, 10.0), WorkerSpeed("fast", 0, 8, 40.0)], pending=0)
    # [("r1", "fast")]: 2000 / 40 + 2 = 52 s there against 2000 / 10 = 200 s staying
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from rlboost.policies.placement import SPEED_TOLERANCE, WorkerSpeed, speed_bands

MIGRATION_COST_S = 2.0  # default seconds a move costs: revoke, flush, re-assign and re-prefill of the context
MAX_MOVES = 16  # default bound on the moves of one pass (the next pass, a balance interval later, does more)


@dataclass(frozen=True, slots=True)
class RunningResponse:
    """A response generating on a worker, as the rebalance sees it."""

    request_id: str
    worker_id: str
    remaining: float  # expected tokens still to come (placement.expected_remaining)


def plan_speed_rebalance(
    running: Sequence[RunningResponse],
    workers: Sequence[WorkerSpeed],
    pending: int,
    migration_cost_s: float = MIGRATION_COST_S,
    max_moves: int = MAX_MOVES,
    min_speedup: float = 1 + SPEED_TOLERANCE,
) -> list[tuple[str, str]]:
    """(request id, target worker id) for the responses to move, at most `max_moves`, latest-finishing first.

    Nothing moves while requests are pending (placement fills free slots then). A response on worker s at rate
    r_s moves to the least-loaded worker t of the fastest band with a free slot when r_t >= min_speedup x r_s and
    remaining / r_t + migration_cost_s < remaining / r_s. Each move takes one of the target's free slots.
    Deterministic: ties break on the request id, then the worker id.
    """
    if pending > 0 or max_moves <= 0:
        return []
    rate = {w.worker_id: w.tokens_per_s for w in workers}
    free = [w for w in workers if w.running < w.capacity and w.tokens_per_s > 0]  # measured, with a free slot
    bands = speed_bands(free, horizon_s=1.0, tolerance=min_speedup - 1)  # no sync_s: the decode rate alone
    heap = [(b, w.running / w.capacity, w.worker_id, w.running, w.capacity) for w, b in zip(free, bands, strict=True)]
    heapq.heapify(heap)  # fastest band first, least loaded within it: the tail spreads one by one
    stay = sorted(
        (r for r in running if rate.get(r.worker_id, 0.0) > 0 and r.remaining > 0),
        key=lambda r: (-r.remaining / rate[r.worker_id], r.request_id),
    )
    moves: list[tuple[str, str]] = []
    for r in stay:
        if not heap or len(moves) >= max_moves:
            break
        band, _, target, load, capacity = heap[0]
        source_rate, target_rate = rate[r.worker_id], rate[target]
        if target_rate < min_speedup * source_rate:
            continue  # the fast free worker is not enough faster than this one (a slower one may gain below)
        if r.remaining / target_rate + migration_cost_s >= r.remaining / source_rate:
            continue  # too little left to win back the move's cost
        moves.append((r.request_id, target))
        if load + 1 < capacity:
            heapq.heapreplace(heap, (band, (load + 1) / capacity, target, load + 1, capacity))
        else:
            heapq.heappop(heap)
    return moves
