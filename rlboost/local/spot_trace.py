"""Spot availability traces (Bamboo format) and the spot pool's target size over time.

A trace file has one event per line, `seconds,instances`: from `seconds` after the trace start the
count is `instances`, until the next line. Lines may end in CRLF; blank lines, `#` comments and a
non-numeric header line are skipped. Events at the same second keep the last one (the Bamboo files
write a step as two lines at the same time).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be used; the message names the file, line and fix."""


@dataclass(frozen=True)
class SpotTrace:
    """A step function: `times[i]` (trace seconds, ascending) -> `counts[i]` instances."""

    times: tuple[float, ...]
    counts: tuple[int, ...]
    source: str = "<trace>"

    @property
    def span_s(self) -> float:
        return self.times[-1] if self.times else 0.0

    def count_at(self, t: float) -> int:
        """Instances available `t` trace-seconds after the start (the first count before the first event)."""
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[max(i, 0)]


def parse_trace(text: str, source: str = "<trace>") -> SpotTrace:
    """Parse the text of a trace file; raise TraceError naming the bad line."""
    events: list[tuple[float, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 2:
                raise ValueError
            seconds, count = float(parts[0]), int(float(parts[1]))
        except ValueError:
            if not events and lineno == 1:  # a header such as `seconds,instances`
                continue
            raise TraceError(f"{source}:{lineno}: expected 'seconds,instances' (two numbers), got {line!r}") from None
        if seconds < 0 or count < 0:
            raise TraceError(f"{source}:{lineno}: seconds and instances must be >= 0, got {line!r}")
        if events and seconds < events[-1][0]:
            raise TraceError(
                f"{source}:{lineno}: time {seconds} goes backwards (previous {events[-1][0]}); times must be ascending: sort the trace"
            )
        if events and seconds == events[-1][0]:
            events[-1] = (seconds, count)
        else:
            events.append((seconds, count))
    if not events:
        raise TraceError(f"{source}: no 'seconds,instances' lines found")
    return SpotTrace(tuple(t for t, _ in events), tuple(c for _, c in events), source)


def load_trace(path: str | Path) -> SpotTrace:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"--spot-trace: file not found: {path}") from None
    return parse_trace(text, str(path))


@dataclass(frozen=True)
class TraceSchedule:
    """A trace replayed against a clock of trace seconds, clamped to the pool's bounds.

    Two clocks: wall time (`trace seconds = wall seconds x time_scale`), or the job's progress
    (`step_seconds` set: each step's worth of finished samples advances the trace by `step_seconds`, so
    where the trace's events land in the job does not depend on how fast the machine runs it).
    """

    trace: SpotTrace
    time_scale: float = 1.0
    min_replicas: int = 0
    max_replicas: int = 16
    step_seconds: float | None = None  # progress clock: trace seconds per step of finished samples
    samples_per_step: int = 1

    def __post_init__(self) -> None:
        if self.time_scale <= 0:
            raise TraceError(f"--trace-time-scale: must be > 0, got {self.time_scale}")
        if self.step_seconds is not None and self.step_seconds <= 0:
            raise TraceError(f"--trace-step-seconds: must be > 0, got {self.step_seconds}")

    @property
    def by_progress(self) -> bool:
        return self.step_seconds is not None

    def trace_seconds(self, wall_elapsed_s: float, samples_finished: int) -> float:
        """Where the replay is: from the wall clock, or from the samples the manager has finished so far."""
        if self.step_seconds is None:
            return wall_elapsed_s * self.time_scale
        return samples_finished / max(self.samples_per_step, 1) * self.step_seconds

    def target(self, trace_s: float) -> int:
        """Spot workers wanted at `trace_s` seconds into the trace."""
        count = self.trace.count_at(trace_s)
        return max(self.min_replicas, min(self.max_replicas, count))


def reconcile(current: list[str], target: int, next_index: int, prefix: str = "spot-") -> tuple[list[str], list[str]]:
    """Which workers to kill and which ids to start so that `current` becomes `target` workers.

    Kills the newest workers first (the last in `current`); new ids continue from `next_index`,
    so a worker id is never reused within a run.
    """
    if len(current) > target:
        return list(current[target:][::-1]), []
    return [], [f"{prefix}{next_index + i}" for i in range(target - len(current))]
