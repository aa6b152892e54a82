"""Python's garbage collector in a long-running service: every pause measured, start-up's objects kept out of it.

A full (generation 2) collection walks every container object the process tracks. With torch and transformers
loaded those are hundreds of thousands, so each full collection paused a rollout-worker of the default job for
0.2-0.5 s (more as the run went on), a few times a minute: the cohort it was decoding came back that much later and
its step took ~0.4 s instead of ~0.2 (docs/benchmarks.md, "Step time against TRL").

- `watch()` (every service, from `rlboost.observability.setup_logging`) times each collection into
  `rlboost_gc_pause_seconds{generation}`.
- `freeze_after_start()` (the heavy services, once started: a worker's engine loaded, the trainer's model built)
  moves every object alive into the permanent generation (`gc.freeze`), so later collections walk only what the
  service made since. Start-up's cyclic garbage, if any, is frozen with it rather than collected: a full collection
  first would add its pause to the start-up of every new spot worker.
"""

from __future__ import annotations

import gc
import time

from prometheus_client import CollectorRegistry, Histogram

GC_PAUSE = Histogram(
    "rlboost_gc_pause_seconds",
    "Seconds each garbage collection held the process (every thread waits), by generation (2: full).",
    ["generation"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
# GC_PAUSE alone, for a service whose /metrics serves a registry of its own (the weight-server's, one per app)
registry = CollectorRegistry(auto_describe=True)
registry.register(GC_PAUSE)
_started: list[float] = []  # the running collection's start (collections do not nest)


def watch() -> None:
    """Time every collection of this process into GC_PAUSE (once per process)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def freeze_after_start() -> int:
    """Keep every object alive now out of later collections; returns how many were frozen."""
    gc.freeze()
    return gc.get_freeze_count()


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        GC_PAUSE.labels(str(info["generation"])).observe(time.perf_counter() - _started.pop())
