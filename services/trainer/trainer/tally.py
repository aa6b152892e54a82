"""One step's tally: what it counted, when its phases ended, and what its training added up, for its report.

Both step kinds (whole groups and partial rollout, trainer.assembly) fill the same three records; the step
report (trainer.reporting) reads them. Torch-free apart from LossStats' type.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from trainer.grpo import LossStats


@dataclass
class StepCounts:
    """Samples and prompts of one step, counted as they arrive and when its groups complete."""

    skipped: int = 0  # dataset prompts skipped for length while taking the step's batch
    off_policy: int = 0  # samples older than algorithm.maxStaleness: weight 0 (a dropped sample is not counted)
    stale: int = 0  # samples within algorithm.maxStaleness but older than the step's version
    stale_tokens: int = 0  # trained response tokens generated under an older version (partial rollout, rolloutAhead)
    carried_over: int = 0  # partial rollout: samples still owed at the step's end, continued next step
    baseline_excluded: int = 0  # samples kept out of their group's baseline (trainer.advantages.exclusion)
    finish_reasons: dict[str, int] = field(default_factory=dict)  # finish_reason ('?' when empty) -> samples

    def finished(self, reason: str | None) -> None:
        key = reason or "?"
        self.finish_reasons[key] = self.finish_reasons.get(key, 0) + 1


@dataclass
class StepClock:
    """When one step's phases ended (time.monotonic()): request, first and last trajectory, optimizer step, sync."""

    start: float = field(default_factory=time.monotonic)  # the Rollout request
    first_trajectory: float | None = None  # seconds from start to the first new trajectory; None: none yet
    rollout_end: float = 0.0  # the last trajectory
    train_end: float = 0.0  # the optimizer step done
    sync_end: float = 0.0  # the new weights published (and colocated workers resumed)

    def arrived(self) -> None:
        """A batch of new trajectories is in: the first one dates the step's first trajectory."""
        if self.first_trajectory is None:
            self.first_trajectory = time.monotonic() - self.start


@dataclass
class TrainSums:
    """Rank 0's running sums of one step's training: loss, loss statistics and seconds of compute."""

    loss: float = 0.0
    stats: LossStats = field(default_factory=lambda: LossStats(0, 0, 0.0, 0.0))
    compute_s: float = 0.0  # rounds and the optimizer step: what trainer_idle_seconds subtracts

    def add(self, loss: float, stats: LossStats, seconds: float) -> None:
        self.loss += loss
        self.compute_s += seconds
        self.stats = self.stats + stats


@dataclass
class StepTally:
    """Everything one step counts and times, filled as the step goes, read once by its report."""

    counts: StepCounts = field(default_factory=StepCounts)
    clock: StepClock = field(default_factory=StepClock)
    sums: TrainSums = field(default_factory=TrainSums)
