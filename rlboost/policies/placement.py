"""Placement: pending requests go to the least-loaded worker holding their weight version.

Load = running / capacity. Pure functions over small views, O((W + n) log W) per pass.

Speed-aware placement (`place_by_speed`) adds what the manager measured per worker: its per-request decode
rate and its weight-sync time. Slow or far workers count each request as more than one slot's load, so the
fast ones fill first, and of the requests placed in one pass the longest expected go to the fastest workers,
the shortest to the slowest. With equally fast workers it is `place`. Pure: no clock, no I/O.

    place_by_speed(2, [900.0, 30.0], [WorkerSpeed("fast", 0, 4, 80.0), WorkerSpeed("slow", 0, 4, 20.0)])
    # [(0, "fast"), (1, "slow")]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """What placement needs to know about one eligible worker."""

    worker_id: str
    running: int  # requests it holds now (including ones being revoked)
    capacity: int  # max concurrent requests


def place(n: int, workers: Iterable[WorkerLoad]) -> list[str]:
    """A worker id for each of up to `n` requests, least loaded first; fewer if capacity runs out.

    Ties break on the worker id so the result is deterministic.
    """
    heap = [(w.running / w.capacity, w.worker_id, w.running, w.capacity) for w in workers if w.running < w.capacity]
    heapq.heapify(heap)
    out: list[str] = []
    while heap and len(out) < n:
        _, wid, running, capacity = heapq.heappop(heap)
        out.append(wid)
        running += 1
        if running < capacity:
            heapq.heappush(heap, (running / capacity, wid, running, capacity))
    return out


@dataclass(frozen=True, slots=True)
class VersionView:
    """A worker as seen by the weight-version policy."""

    worker_id: str
    version: int  # version it holds
    requested: int  # last version it was told to move to (-1: none)


def version_moves(
    workers: Sequence[VersionView], pending_versions: set[int], busy_versions: set[int]
) -> list[tuple[str, int]]:
    """Workers to send SetWeightVersion(v), once each, when work for a newer version v is pending.

    A worker moves only when no work of its own version is pending or running (`busy_versions`),
    so older work is never stranded without a worker that can generate it.
    """
    if not pending_versions:
        return []
    target = max(pending_versions)
    return [
        (w.worker_id, target)
        for w in workers
        if w.version < target and w.requested < target and w.version not in busy_versions
    ]


# ---- speed-aware placement (issue 16) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSpeed:
    """A worker with a free slot as speed-aware placement sees it: its load and what the manager measured."""

    worker_id: str
    running: int  # requests it holds now
    capacity: int  # max concurrent requests
    tokens_per_s: float = 0.0  # per-request decode rate (EWMA over its requests); 0: not measured yet
    sync_s: float = 0.0  # seconds it takes to fetch and load a new weight version (EWMA); 0: not measured


SPEED_TOLERANCE = 0.5  # speeds within a factor 1.5 of each other count as equal (EWMAs of equal GPUs differ)


def expected_remaining(tokens_so_far: int, prior: float, max_new_tokens: int) -> float:
    """Expected response tokens still to come for a request that has generated `tokens_so_far`.

    `prior`: its expected full length (its prompt group's mean finished length, else the step's, else
    max_new_tokens). Lengths are long-tailed, so one that already ran past its prior is expected to run about
    as long again (the longest-running have the most left: the same reading as length_offload's).
    """
    left = max(0, max_new_tokens - tokens_so_far)
    guess = tokens_so_far if tokens_so_far >= prior else prior - tokens_so_far
    return float(min(max(guess, 1.0), left)) if left else 0.0


def speed_bands(workers: Sequence[WorkerSpeed], horizon_s: float, tolerance: float = SPEED_TOLERANCE) -> list[int]:
    """Per worker, its speed band: 0 for the fastest, +1 per factor (1 + tolerance) slower.

    The speed is the worker's tokens per step cycle: tokens_per_s x horizon / (horizon + sync_s), so a worker far
    from the weights (long sync) counts as slower in proportion to the share of each step it spends syncing.
    Unmeasured workers count as the median measured one; with nothing measured every band is 0.
    """
    measured = sorted(w.tokens_per_s for w in workers if w.tokens_per_s > 0)
    if not measured:
        return [0] * len(workers)
    median = measured[len(measured) // 2]
    horizon = max(horizon_s, 1e-9)
    speeds = [(w.tokens_per_s if w.tokens_per_s > 0 else median) * horizon / (horizon + w.sync_s) for w in workers]
    top, step = max(speeds), math.log1p(tolerance)
    return [int(math.log(top / s) / step + 1e-9) for s in speeds]


def place_by_speed(
    n: int, expected: Sequence[float], workers: Sequence[WorkerSpeed], tolerance: float = SPEED_TOLERANCE
) -> list[tuple[int, str]]:
    """(index into `expected`, worker id) for up to min(n, len(expected), free slots) pending requests.

    `expected`: the expected remaining tokens of the first pending requests, in queue order (a window that may
    be longer than `n`: the slow workers pick the shortest of it). Slow workers get fewer effective slots: a
    worker in band b counts each request as (1 + tolerance)^b of one, so the fast ones fill first; every free
    slot is still used when requests remain (a slow slot beats none). Then the fastest band's slots take the
    longest requests of the window and the slower bands the shortest, the slowest the very shortest, so the
    tail lands on the fast workers. With every worker in one band it is `place` exactly: request i goes to
    place(...)[i]. Deterministic: ties break on the band, then the worker id.
    """
    k = min(n, len(expected))
    horizon = max(expected[:k], default=0.0) / max(1e-9, _median_speed(workers))
    bands = speed_bands(workers, horizon, tolerance)
    heap = [
        (w.running / (w.capacity * (1 + tolerance) ** -b), b, w.worker_id, w.running, w.capacity)
        for w, b in zip(workers, bands, strict=True)
        if w.running < w.capacity
    ]
    heapq.heapify(heap)
    slots: list[tuple[int, str]] = []  # (band, worker id) in the order least-loaded placement takes them
    while heap and len(slots) < k:
        _, band, wid, running, capacity = heapq.heappop(heap)
        slots.append((band, wid))
        if running + 1 < capacity:
            weight = (1 + tolerance) ** -band
            heapq.heappush(heap, ((running + 1) / (capacity * weight), band, wid, running + 1, capacity))
    if len({band for band, _ in slots}) <= 1:
        return [(i, wid) for i, (_, wid) in enumerate(slots)]
    return _pair_by_length(slots, expected)


def _median_speed(workers: Sequence[WorkerSpeed]) -> float:
    measured = sorted(w.tokens_per_s for w in workers if w.tokens_per_s > 0)
    return measured[len(measured) // 2] if measured else 1.0


def _pair_by_length(slots: list[tuple[int, str]], expected: Sequence[float]) -> list[tuple[int, str]]:
    """The fastest band's slots take the longest requests; the other slots the shortest, slowest the shortest."""
    by_length = sorted(range(len(expected)), key=lambda i: (-expected[i], i))  # longest first, queue order on ties
    ordered = sorted(slots, key=lambda s: s[0])  # stable: fastest band first, placement order within a band
    fast = sum(1 for band, _ in ordered if band == ordered[0][0])
    slow = len(ordered) - fast  # >= 1: the caller pairs only when the slots span two bands
    longest = by_length[:fast]
    shortest = by_length[len(by_length) - slow :]  # the slow slots' share, from the short end
    picks = longest + shortest  # longest ... shortest, matching ordered's fastest ... slowest
    return [(i, wid) for i, (_, wid) in zip(picks, ordered, strict=True)]
