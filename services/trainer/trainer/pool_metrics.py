"""Per-step metrics the trainer reads from the rollout-manager's status (GetStatus after each step) and from the
step's responses, for the step report and so for every tracking backend (spec.logging):

- tokens/s per pool: the growth of the pool's workers' `tokens_generated` since the previous step, over the time
  between the two status reads (a worker gone meanwhile takes its last tokens with it: an undercount);
- workers per pool, workers lost since the previous step (gone from the status: preempted, crashed, drained);
- migrations (the manager's total) and the cost so far at `spec.prices` (accelerators in use, integrated per step
  at the rate of its end, since this trainer process started);
- the spot pool's busy fraction: the growth of the manager's busy seconds of the spot pool (time each worker held at
  least one request) over spot workers x the time between the two status reads (the busy spot scaler's input);
- what preemptions cost (issue 34): the growth of the manager's preemptions, of its preempted slot-seconds (moved
  requests' stalls) and of its fleet's slot-seconds, and the share of the one in the other;
- response length percentiles of the step's samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlboost.spec import JobSpec
from rlboost.wire.rollout_io import ManagerStatus


@dataclass
class PoolStep:
    """What one status read adds to the step report (empty dicts and zeros when the manager did not answer)."""

    tokens_per_second: dict[str, float] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    workers_lost: int = 0
    migrations: int = 0
    cost_so_far: float = 0.0
    spot_busy_fraction: float = 0.0
    preemption: dict[str, float] = field(default_factory=dict)  # the StepReport's preemption fields


class PoolMeter:
    """Keeps the previous status read, so each step's rates are differences."""

    def __init__(self, spec: JobSpec, now: float) -> None:
        self.spec = spec
        self._tokens: dict[str, int] = {}  # worker id -> tokens_generated at the previous read
        self._at = now
        self._cost = 0.0
        self._rate = self.cost_per_hour({})
        self._spot_busy_s = 0.0  # the manager's spot busy seconds at the previous read
        self._preempted = (0, 0.0, 0.0)  # the manager's preemptions, preempted and fleet slot-seconds, previous read

    def cost_per_hour(self, workers: dict[str, int]) -> float:
        """USD per hour: the trainer's and reserved workers' accelerators at the reserved price, spot's at spot's."""
        return self.spec.cost_per_hour(workers.get("reserved", 0), workers.get("spot", 0))

    def update(self, status: ManagerStatus | None, now: float) -> PoolStep:
        elapsed = max(now - self._at, 1e-9)
        if status is None:
            self._cost += self._rate * elapsed / 3600
            self._at = now
            return PoolStep(cost_so_far=self._cost)
        grown: dict[str, float] = {}
        workers: dict[str, int] = {}
        for w in status.workers:
            pool = w.pool.value
            workers[pool] = workers.get(pool, 0) + 1
            grown[pool] = grown.get(pool, 0.0) + max(0, w.tokens_generated - self._tokens.get(w.worker_id, 0))
        lost = len(set(self._tokens) - {w.worker_id for w in status.workers})
        self._tokens = {w.worker_id: w.tokens_generated for w in status.workers}
        self._rate = self.cost_per_hour(workers)
        self._cost += self._rate * elapsed / 3600
        self._at = now
        rates = {pool: n / elapsed for pool, n in grown.items()}
        busy = self._spot_busy(status, workers.get("spot", 0), elapsed)
        return PoolStep(rates, workers, lost, status.migrations, self._cost, busy, self._preemption(status))

    def _preemption(self, status: ManagerStatus) -> dict[str, float]:
        """What preemptions cost since the previous read (a restarted manager, whose totals fell, counts anew)."""
        now = (status.preemptions, status.preempted_slot_seconds, status.slot_seconds)
        before = self._preempted if all(a >= b for a, b in zip(now, self._preempted, strict=True)) else (0, 0.0, 0.0)
        self._preempted = now
        n, lost, slots = (a - b for a, b in zip(now, before, strict=True))
        return {
            "preemptions": int(n),
            "preempted_slot_seconds": lost,
            "rollout_slot_seconds": slots,
            "preempted_slot_share": min(1.0, lost / slots) if slots > 0 else 0.0,
        }

    def _spot_busy(self, status: ManagerStatus, spot_workers: int, elapsed: float) -> float:
        """Busy share of the spot workers' time since the previous read, 0..1 (0 without spot workers)."""
        total = status.busy_seconds.get("spot", 0.0)
        grown = total - self._spot_busy_s if total >= self._spot_busy_s else total  # a restarted manager counts anew
        self._spot_busy_s = total
        return min(1.0, grown / (spot_workers * elapsed)) if spot_workers else 0.0


def length_percentiles(lengths: Sequence[int]) -> dict[str, float]:
    """p50, p90 and max of the responses' lengths in tokens (nearest rank); zeros for no responses."""
    if not lengths:
        return {"p50": 0.0, "p90": 0.0, "max": 0.0}
    ordered = sorted(lengths)

    def rank(q: float) -> float:
        return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])

    return {"p50": rank(0.5), "p90": rank(0.9), "max": float(ordered[-1])}
