"""How many of the available spot instances a job uses: as many as the measured load keeps busy.

Like Kubernetes' horizontal autoscaler, the rule scales by the ratio of the spot pool's measured busy
fraction to a target: `desired = ceil(used * busy / target_busy)`, unchanged while the ratio is within
`tolerance` of 1, growing only when the trainer waited for the spot tail (more spot would not shorten a
step nobody waits on), never below one instance. The cap starts unlimited (use what exists, then trim);
`cap()` never gives more than the instances available or `limit`. Deterministic, no clock, no network.

`SpotScaler` is the paper's hybrid in the simulator (`rlboost simulate`, rlboost/simulate/runner.py).

`BusySpotScaler` (issue 17) pays only for busy spot: it shrinks by the idle share of the paid spot time
(spot idle while the trainer trains is money for nothing), grows only when the trainer waited for rollout and
the spot it has is busy, and with the prices per pool known grows only while the marginal instance pays for
itself: one more instance costs `spot $/s x step`, and can save at most its share `wait / (used + 1)` of the
whole job's `$/s` that the trainer's wait wastes. With prices, "busy enough" is relative to the break-even busy
share: if samples follow busy GPU-seconds, a spot GPU busy a share b of its paid time raises samples per dollar
exactly when b > spot $/GPU-h / reserved $/GPU-h (0.25 at $2.66 vs $10.47), whatever the pool size; the pool
shrinks only below `headroom` x that share (and never below it keeps an instance that pays for itself). Always within [min_instances, max_instances] (the spec's
minReplicas/maxReplicas). The simulator's `rlboost` policy and the operator's desired spot replicas
(rlboost_operator/spot_busy.py, from the trainer's step report) both run it.
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


@dataclass(frozen=True)
class SpotPrices:
    """What each pool costs, USD per hour."""

    reserved_per_hour: float  # the whole reserved pool (trainer + colocated rollout)
    spot_per_instance_hour: float  # one spot instance (worker)
    reserved_gpus: int = 1  # GPUs of the reserved pool
    gpus_per_instance: int = 1  # GPUs of one spot instance

    def break_even_busy(self) -> float:
        """Busy share above which a spot GPU raises samples per dollar: the per-GPU price ratio."""
        reserved = self.reserved_per_hour / max(self.reserved_gpus, 1)
        spot = self.spot_per_instance_hour / max(self.gpus_per_instance, 1)
        return spot / reserved if reserved > 0 else 1.0


@dataclass(frozen=True)
class SpotSignals:
    """One step's measurements of the spot pool, as the rollout-manager reports them."""

    used: int  # spot instances that were up during the step
    busy_fraction: float  # share of their paid time spent generating, 0..1
    trainer_wait_s: float  # seconds the trainer waited for rollout this step
    step_s: float  # the step's wall-clock seconds


@dataclass
class BusySpotScaler:
    """The desired spot instance count, updated once per step; see the module docstring."""

    min_instances: int = 0
    max_instances: int = UNLIMITED
    prices: SpotPrices | None = None  # None: grow whenever the trainer waited
    target_busy: float = 0.85  # busy share the pool is sized for
    tolerance: float = 0.1  # no shrink while busy >= target_busy x (1 - tolerance)
    headroom: float = 1.5  # with prices: the pool is sized for headroom x the break-even busy share
    target: int = UNLIMITED  # starts unlimited: use what exists, then trim

    def __post_init__(self) -> None:
        if not 0 <= self.min_instances <= self.max_instances:
            raise ValueError("BusySpotScaler: need 0 <= min_instances <= max_instances (minReplicas <= maxReplicas)")
        self.target = self._bound(self.target)

    def _bound(self, n: int) -> int:
        return max(self.min_instances, min(self.max_instances, n))

    def cap(self, available: int) -> int:
        """Instances to use now, of `available`."""
        return max(0, min(available, self.target))

    def update(self, s: SpotSignals) -> int:
        """One step's signals; returns the new desired count."""
        if s.used == 0:
            if s.trainer_wait_s > 0 and self.target == 0:
                self.target = self._bound(1)  # nothing to measure yet: probe with one instance
            return self.target
        sized_for = self.sized_for()
        if s.busy_fraction < sized_for * (1 - self.tolerance):
            self.target = self._bound(max(1, math.ceil(s.used * s.busy_fraction / sized_for)))
        elif s.trainer_wait_s > 0 and s.busy_fraction >= sized_for and self._pays(s):
            self.target = self._bound(s.used + max(1, math.ceil(s.used * s.trainer_wait_s / max(s.step_s, 1e-9))))
        # else unchanged: busy enough, nobody waits. Not lowered to `used`: fewer up (a preemption, a thin
        # market) is no evidence against the instances that come back.
        return self.target

    def sized_for(self) -> float:
        """The busy share the pool is sized for: target_busy, or with prices headroom x break-even (if lower)."""
        if self.prices is None:
            return self.target_busy
        return min(self.target_busy, self.headroom * self.prices.break_even_busy())

    def _pays(self, s: SpotSignals) -> bool:
        """One more instance costs less than the share of the trainer's wait it could save."""
        if self.prices is None:
            return True
        job_per_s = (self.prices.reserved_per_hour + s.used * self.prices.spot_per_instance_hour) / 3600
        saved = job_per_s * s.trainer_wait_s / (s.used + 1)
        return saved >= self.prices.spot_per_instance_hour / 3600 * s.step_s
