"""Adaptive partial-response offload (RLBoost): the window T reserved workers generate for.

Each step the reserved workers generate for T seconds; then their in-flight responses migrate to
spot workers and the reserved accelerators go back to training. After the step, T moves by a
fraction of the measured bubble difference:
- the trainer waited for the spot tail (spot too slow for what it got): offload later, T grows;
- spot workers sat idle while the trainer trained: offload earlier, T shrinks.
With no spot capacity there is no offload at all: exactly reserved-only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OffloadWindow:
    window_s: float = 120.0  # current T
    min_s: float = 5.0  # never offload sooner than this
    max_s: float = 3600.0
    gain: float = 1.0 / 3.0  # fraction of the bubble difference applied per step (RLBoost uses 1/3)
    deadband_s: float = 1.0  # ignore differences smaller than measurement noise

    def window(self, spot_workers: int) -> float | None:
        """T for this step, or None (never offload) when no spot worker can take the tail."""
        return self.window_s if spot_workers > 0 else None

    def should_offload(self, elapsed_s: float, spot_workers: int) -> bool:
        t = self.window(spot_workers)
        return t is not None and elapsed_s >= t

    def update(self, trainer_wait_s: float, spot_idle_s: float) -> float:
        """Move T from one step's measurements; returns the new T."""
        diff = trainer_wait_s - spot_idle_s
        if abs(diff) > self.deadband_s:
            self.window_s = min(self.max_s, max(self.min_s, self.window_s + self.gain * diff))
        return self.window_s
