"""A worker's start-up, split into its parts (issue 34): what a new spot worker costs before it generates.

Seconds are counted from the process's start (the kernel's record of it): `process` (the interpreter, imports and
the engine's construction, until start-up work begins), `assets` (model config and tokenizer pulled from the weight-server), `engine` (the engine
built from them) and `weights` (the newest version pulled and verified; it overlaps the engine's start), `ready`
(current weights held, registering next) and `first_assignment` (the manager's first request reached it). Each is
a log line field of "start-up" / "first assignment" and the gauge rlboost_worker_startup_seconds{part}, which
bench/preemption_bench.py reads.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable
from typing import TypeVar

from rollout_worker import metrics

log = logging.getLogger("rollout_worker")
T = TypeVar("T")


def process_started_at() -> float:
    """Wall-clock time this process started (Linux /proc; elsewhere: now, so the interpreter's start is left out).
    Its age is the system's uptime less its start in ticks after boot (both to 10 ms; /proc/stat's boot time is
    whole seconds, too coarse)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


class StartupClock:
    """The parts of one worker's start-up, in seconds; single-threaded (the worker's event loop)."""

    def __init__(self) -> None:
        self.started_at = process_started_at()
        self.parts: dict[str, float] = {}
        self._set("process", time.time() - self.started_at)
        self._first_assignment = False

    async def timed(self, part: str, work: Awaitable[T]) -> T:
        """Await `work`, recording its seconds as `part`."""
        t0 = time.monotonic()
        try:
            return await work
        finally:
            self._set(part, time.monotonic() - t0)

    def ready(self, worker_id: str) -> None:
        """Current weights held: log the split so far."""
        self._set("ready", time.time() - self.started_at)
        log.info("start-up", extra={"worker_id": worker_id, **{f"{k}_s": round(v, 3) for k, v in self.parts.items()}})

    def assigned(self, worker_id: str) -> None:
        """The manager's first assignment arrived (later ones are not start-up)."""
        if self._first_assignment:
            return
        self._first_assignment = True
        seconds = time.time() - self.started_at
        self._set("first_assignment", seconds)
        log.info("first assignment", extra={"worker_id": worker_id, "first_assignment_s": round(seconds, 3)})

    def _set(self, part: str, seconds: float) -> None:
        self.parts[part] = seconds
        metrics.STARTUP_SECONDS.labels(part).set(seconds)
