"""Each RLJob's phase, cost, budget, progress and trainer restarts as Prometheus gauges, read from the RLJob itself
on every watch event (its status is the one record of them: whichever operator replica leads exports the same
values, and a restarted one exports them again from its first list). A deleted RLJob's series go."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

from rlboost.spec import JobSpec, JobSpecError, parse_job_spec
from rlboost_operator.metrics import (
    JOB_BUDGET,
    JOB_COST,
    JOB_COST_RATE,
    JOB_PHASE,
    JOB_STEPS,
    JOB_STEPS_TOTAL,
    PHASES,
    TRAINER_BACKOFF_LIMIT,
    TRAINER_RESTARTS,
)

PER_JOB = (JOB_COST, JOB_COST_RATE, JOB_BUDGET, JOB_STEPS, JOB_STEPS_TOTAL, TRAINER_RESTARTS, TRAINER_BACKOFF_LIMIT)


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _spec(data: Any) -> JobSpec | None:
    """The spec with its defaults (None for one that does not validate: its limits are then not exported)."""
    try:
        return parse_job_spec(data or {}, "RLJob.spec")
    except JobSpecError:
        return None


def observe(namespace: str, name: str, rljob: Mapping[str, Any]) -> None:
    """Set the job's gauges from the RLJob as the watch delivered it."""
    status, spec = rljob.get("status") or {}, _spec(rljob.get("spec"))
    phase = status.get("phase") or "Pending"
    for each in PHASES:
        JOB_PHASE.labels(namespace, name, each).set(1.0 if each == phase else 0.0)
    values = {
        JOB_COST: status.get("costSoFar") or 0.0,
        JOB_COST_RATE: status.get("costPerHour") or 0.0,
        JOB_STEPS: status.get("stepsCompleted") or 0,
        JOB_STEPS_TOTAL: status.get("stepsTotal") or (spec.algorithm.steps if spec else None),
        TRAINER_RESTARTS: status.get("trainerRestarts") or 0,
        TRAINER_BACKOFF_LIMIT: spec.trainer.backoff_limit if spec else None,
        JOB_BUDGET: spec.budget if spec else None,
    }
    for gauge, value in values.items():
        number = _number(value)
        if number is not None:
            gauge.labels(namespace, name).set(number)
        else:
            with contextlib.suppress(KeyError):  # unset: no budget, or a spec that does not validate
                gauge.remove(namespace, name)


def forget(namespace: str, name: str) -> None:
    """The RLJob was deleted: its series go."""
    for each in PHASES:
        with contextlib.suppress(KeyError):
            JOB_PHASE.remove(namespace, name, each)
    for gauge in PER_JOB:
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
