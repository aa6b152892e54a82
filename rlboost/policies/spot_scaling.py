"""How many of the available spot instances a job uses: as many as the measured load keeps busy.

Like Kubernetes' horizontal autoscaler, the rule scales by the ratio of the spot pool's measured busy
fraction to a target: `desired = ceil(used * busy / target_busy)`, unchanged while the ratio is within
`tolerance` of 1, growing only when the trainer waited for the spot tail (more spot would not shorten a
step nobody waits on), never below one instance. The cap starts unlimited (use what exists, then trim);
`cap()` never gives more than the instances available or `limit`. Deterministic, no clock, no network.

Used by the simulator (`rlboost simulate`, rlboost/simulate/runner.py) when no fixed spot cap is given.
The operator does not use it: it sizes the spot Deployment to the spot capacity present, or on autoscaled spot
pools to maxReplicas with a shrink while pods stay unschedulable, always within [minReplicas, maxReplicas]
(rlboost_operator/spot_ask.py: Kubernetes scheduling, which the simulator does not model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

UNLIMITED = 1 << 30


@dataclass
class SpotScaler:
    """The spot cap, updated once per step from that step's measurements."""

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
