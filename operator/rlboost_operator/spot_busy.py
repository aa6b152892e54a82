"""Busy sizing of the spot pool (`rollout.spot.sizing: busy`): the operator's side of issue 17's busy spot scaler.

Each step report updates the job's target with rlboost.policies.spot_scaling.BusySpotScaler (the same policy the
simulator's `rlboost` policy runs): the spot workers at the step's end, their busy share over the step
(StepReport.spot_busy_fraction, from the rollout-manager's busy seconds) and the trainer's wait for rollout
(trainer_idle_seconds), at spec.prices, within [minReplicas, maxReplicas]. The spot Deployment then gets the
lower of the target and what the spot nodes present hold (spot.desired_spot_replicas).

The only state is the target, kept in RLJob status.workers.spotTarget so that a restarted operator or a new leader
carries on with it; bounds and prices are taken from the spec each time (an edited spec applies at once).
Pure: nothing here talks to a cluster or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rlboost.policies.spot_scaling import BusySpotScaler, SpotPrices, SpotSignals
from rlboost.spec import JobSpec
from rlboost.wire.events import StepReport
from rlboost_operator import spot
from rlboost_operator.spot_ask import Decision

BUSY = "SpotBusyScaled"  # decision reason: the lower of the nodes' capacity and the busy target


def busy_sized(spec: JobSpec) -> bool:
    """Whether the job asked for busy sizing (opt-in: never the operator's default)."""
    return spec.rollout.spot.sizing == "busy"


def prices(spec: JobSpec) -> SpotPrices:
    """The job's prices per pool: the reserved pool (trainer ranks + reserved workers) and one spot worker (with
    variants: the first the split places, the cheapest per request slot), from JobSpec.cost_per_hour."""
    reserved_workers = spec.rollout.reserved.replicas
    reserved_gpus, spot_gpus = spec.accelerators(reserved_workers, 1)
    reserved_per_hour = spec.cost_per_hour(reserved_workers, 0)
    return SpotPrices(
        reserved_per_hour=reserved_per_hour,
        spot_per_instance_hour=spec.cost_per_hour(reserved_workers, 1) - reserved_per_hour,
        reserved_gpus=reserved_gpus,
        gpus_per_instance=spot_gpus,
    )


def scaler(spec: JobSpec, target: int | None) -> BusySpotScaler:
    """The job's scaler at `target` (None: none yet, start from maxReplicas: use what exists, then trim)."""
    pool = spec.rollout.spot
    start = pool.max_replicas if target is None else target
    return BusySpotScaler(pool.min_replicas, pool.max_replicas, prices(spec), target=start)


def signals(report: StepReport) -> SpotSignals:
    """A step report as the scaler reads it."""
    step_s = report.rollout_seconds + report.train_seconds + report.sync_seconds
    return SpotSignals(
        used=int(report.pool_workers.get("spot", 0)),
        busy_fraction=report.spot_busy_fraction,
        trainer_wait_s=report.trainer_idle_seconds,
        step_s=step_s,
    )


def next_target(spec: JobSpec, target: int | None, report: StepReport) -> int:
    """The target after one step report."""
    return scaler(spec, target).update(signals(report))


def saved_target(workers_status: Mapping[str, Any] | None) -> int | None:
    """status.workers.spotTarget as the operator wrote it (missing or unreadable: None, a fresh start)."""
    value = (workers_status or {}).get("spotTarget")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def busy_decision(nodes: Iterable[Mapping[str, Any]], spec: JobSpec, target: int | None) -> Decision:
    """The spot ask: the lower of what the spot nodes present hold and the (bounded) busy target."""
    pool = spec.rollout.spot
    capacity = spot.desired_spot_replicas(nodes, pool)
    bounded = scaler(spec, target).target
    n = min(capacity, bounded)
    why = "capacity on spot nodes" if capacity <= bounded else "the spot workers the steps keep busy"
    return Decision(n, BUSY, f"{n} spot workers: {why} (capacity {capacity}, busy target {bounded})")
