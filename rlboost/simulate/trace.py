"""A spot trace for the simulator: the parsed step function (rlboost.local.spot_trace), repeating past its end."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

from rlboost.local.spot_trace import TraceError
from rlboost.local.spot_trace import parse_trace as parse_events

__all__ = ["SpotTrace", "TraceError", "load_trace", "parse_trace"]


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
    events = parse_events(text, source)
    return SpotTrace(events.times, events.counts, max(events.span_s, min_duration))


def load_trace(path: str | Path) -> SpotTrace:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"trace file not found: {path}") from None
    return parse_trace(text, str(path))
