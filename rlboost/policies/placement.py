"""Placement: pending work goes to the least-loaded worker that holds the step's weight version."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class WorkerLoad:
    """What placement needs to know about one worker."""

    worker_id: str
    running: int  # requests it generates now
    capacity: int  # max concurrent requests
    weight_version: int  # version it holds
    draining: bool = False  # draining workers take no new work

    @property
    def free(self) -> int:
        return self.capacity - self.running

    @property
    def load(self) -> float:
        return self.running / self.capacity if self.capacity else 1.0


def eligible(worker: WorkerLoad, weight_version: int) -> bool:
    return not worker.draining and worker.free > 0 and worker.weight_version == weight_version


def choose_worker(workers: Iterable[WorkerLoad], weight_version: int) -> WorkerLoad | None:
    """The least-loaded eligible worker (ties: most free slots, then id), or None when none can take work."""
    best: WorkerLoad | None = None
    for w in workers:
        if eligible(w, weight_version) and (best is None or _key(w) < _key(best)):
            best = w
    return best


def _key(w: WorkerLoad) -> tuple[float, int, str]:
    return (w.load, -w.free, w.worker_id)


def place_many(workers: Iterable[WorkerLoad], weight_version: int, count: int) -> list[WorkerLoad]:
    """Place `count` requests one by one, each on the least-loaded eligible worker at that moment.

    Same choices as calling `choose_worker` `count` times (updating `running` in between), in
    O((workers + count) log workers). Returns the chosen worker per request, fewer when capacity runs out.
    """
    heap = [(_key(w), i, w) for i, w in enumerate(workers) if eligible(w, weight_version)]
    heapq.heapify(heap)
    chosen: list[WorkerLoad] = []
    while heap and len(chosen) < count:
        _, i, w = heapq.heappop(heap)
        chosen.append(w)
        w.running += 1
        if w.free > 0:
            heapq.heappush(heap, (_key(w), i, w))
    return chosen
