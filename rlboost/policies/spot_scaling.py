"""How many spot instances a job should use of those available: pay only for spot that earns its price.

A spot instance is worth keeping while it is busy enough that its samples per dollar beat the
reserved cluster's. Like Kubernetes' horizontal autoscaler, the rule scales by the ratio of the
measured busy fraction of the spot pool to a target: `desired = ceil(used * busy / target_busy)`,
growing only when the trainer waited for the spot tail. Deterministic, no clock, no network: the
operator (spot Deployment replicas) and the simulator use it alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

UNLIMITED = 1 << 30


@dataclass
class SpotScaler:
    limit: int = UNLIMITED  # the job's maxReplicas
    target_busy: float = 0.7  # busy fraction the pool is sized for
    tolerance: float = 0.1  # no change while |busy/target - 1| is within this
    target: int = UNLIMITED  # current cap (starts unlimited: use what exists, then trim)

    def cap(self, available: int) -> int:
        """Instances to use now, of `available`."""
        return max(0, min(available, self.target, self.limit))

    def update(self, used: int, busy_fraction: float, trainer_wait_s: float) -> int:
        """One step's measurement of the `used` spot instances; returns the new cap."""
        if used == 0:
            return self.target
        ratio = busy_fraction / self.target_busy
        desired = used if abs(ratio - 1.0) <= self.tolerance else math.ceil(used * ratio)
        if desired > used and trainer_wait_s <= 0:
            desired = used  # spot is busy but nobody waits for it: more would not shorten the step
        self.target = max(1, desired)
        return self.target
