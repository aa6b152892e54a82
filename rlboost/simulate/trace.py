"""Spot availability traces (`seconds,instances` per line, Bamboo format) as a step function of time."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the line and the fix."""


@dataclass(frozen=True)
class SpotTrace:
    times: tuple[float, ...]  # ascending seconds since the trace start
    counts: tuple[int, ...]  # instances available from times[i] until times[i+1]
    duration: float  # seconds the trace covers (at least its last event)

    def count_at(self, t: float) -> int:
        """Instances available at time t; the trace repeats after its duration."""
        if self.duration > 0:
            t = t % self.duration
        i = bisect.bisect_right(self.times, t) - 1
        return self.counts[max(i, 0)]

    def scaled(self, factor: float) -> SpotTrace:
        """The same trace with every count multiplied by `factor` (rounded)."""
        return SpotTrace(self.times, tuple(round(c * factor) for c in self.counts), self.duration)

    @staticmethod
    def constant(count: int, duration: float = 3600.0) -> SpotTrace:
        return SpotTrace((0.0,), (count,), duration)


def parse_trace(text: str, source: str = "<trace>", min_duration: float = 3600.0) -> SpotTrace:
    times: list[float] = []
    counts: list[int] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",")
        try:
            t, c = float(parts[0]), int(float(parts[1]))
        except (ValueError, IndexError):
            if not times and lineno == 1:  # a header line
                continue
            raise TraceError(f"{source}:{lineno}: expected 'seconds,instances', got {raw!r}") from None
        if c < 0 or (times and t < times[-1]):
            raise TraceError(f"{source}:{lineno}: counts must be >= 0 and times ascending, got {raw!r}")
        times.append(t)
        counts.append(c)
    if not times:
        raise TraceError(f"{source}: no 'seconds,instances' lines found")
    return SpotTrace(tuple(times), tuple(counts), max(times[-1], min_duration))


def load_trace(path: str | Path) -> SpotTrace:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    return parse_trace(text, str(path))
