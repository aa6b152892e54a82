"""Placement: pending requests go to the least-loaded worker holding their weight version.

Load = running / capacity. Pure functions over small views, O((W + n) log W) per pass.
"""

from __future__ import annotations

import heapq
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
