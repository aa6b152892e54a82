"""Adaptive partial-response offload (RLBoost): the window T for which reserved workers generate.

Each step, reserved workers generate for T seconds; then their in-flight responses migrate to spot
workers and reserved capacity goes back to training. T adapts every step from the measured bubble:

* the trainer waited for the rollout tail (`trainer_wait_s` > 0): spot was overloaded by the offload,
  so reserved workers should keep generating longer -> T grows;
* spot workers sat idle (`spot_idle_s` > 0): they could have taken the work sooner -> T shrinks.

The update is a damped proportional step on the difference, clamped to [min_s, max_s] and scaled by
how much spot capacity is present relative to reserved. With no spot capacity it never offloads, which
is exactly reserved-only behaviour.

    window = OffloadWindow(OffloadConfig())
    window.start_step(now, spot_capacity=8, reserved_capacity=8)
    if window.should_offload(now): ...      # revoke reserved workers' requests once
    window.end_step(StepMeasurements(trainer_wait_s=3.0, spot_idle_s=0.5))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, Field


class OffloadConfig(BaseModel):
    """Tuning of the adaptive offload window."""

    initial_s: float = Field(10.0, gt=0, description="Window T of the first step, seconds.")
    min_s: float = Field(0.5, gt=0, description="Smallest window T, seconds.")
    max_s: float = Field(600.0, gt=0, description="Largest window T, seconds.")
    gain: float = Field(0.5, gt=0, le=1.0, description="Fraction of the measured bubble imbalance applied per step.")


@dataclass(frozen=True)
class StepMeasurements:
    """What one step measured, in seconds."""

    trainer_wait_s: float  # trainer (reserved GPUs) idle waiting for the rollout tail after offload
    spot_idle_s: float  # spot workers idle during the step (mean per spot worker)


class OffloadWindow:
    """The window T, adapted step by step. Pure: time is passed in."""

    def __init__(self, config: OffloadConfig | None = None) -> None:
        self.config = config or OffloadConfig()
        self.window_s = self.config.initial_s
        self._step_start: float | None = None
        self._spot_share = 0.0
        self._offloaded = False

    @property
    def active(self) -> bool:
        """True while a step with spot capacity is running and has not offloaded yet."""
        return self._step_start is not None and self._spot_share > 0 and not self._offloaded

    def start_step(self, now: float, spot_capacity: int, reserved_capacity: int) -> None:
        """A step's rollout begins with this much concurrent capacity in each pool."""
        self._step_start = now
        total = spot_capacity + reserved_capacity
        self._spot_share = spot_capacity / total if total > 0 else 0.0
        self._offloaded = False

    def effective_window(self) -> float:
        """T for this step; infinite without spot capacity (reserved-only)."""
        return self.window_s if self._spot_share > 0 else math.inf

    def should_offload(self, now: float) -> bool:
        """True exactly once per step, when the window has elapsed and spot capacity exists."""
        if not self.active or now - self._step_start < self.effective_window():
            return False
        self._offloaded = True
        return True

    def end_step(self, m: StepMeasurements) -> float:
        """Adapt T from the step's bubble; returns the new T."""
        if self._spot_share > 0:
            # more spot capacity absorbs offloaded work faster, so a given wait calls for a smaller change
            error = m.trainer_wait_s - m.spot_idle_s
            step = self.config.gain * error * (1.0 - self._spot_share / 2)
            self.window_s = min(self.config.max_s, max(self.config.min_s, self.window_s + step))
        self._step_start = None
        return self.window_s
