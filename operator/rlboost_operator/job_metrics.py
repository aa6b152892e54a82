"""Each RLJob's phase, cost, budget, progress and trainer restarts as Prometheus gauges, read from the RLJob itself
on every watch event (its status is the one record of them: whichever operator replica leads exports the same
values, and a restarted one exports them again from its first list). A deleted RLJob's series go."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

from rlboost.spec import AlgorithmSpec, TrainerSpec
from rlboost_operator.metrics import (
    JOB_BUDGET,
    JOB_COST,
    JOB_COST_RATE,
    JOB_PHASE,
    JOB_STEPS,
    JOB_STEPS_TOTAL,
    JOB_SUSPENDING,
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


def _field(spec: Mapping[str, Any], section: str, key: str, model: type[AlgorithmSpec] | type[TrainerSpec]) -> Any:
    """spec.<section>.<key> as written, else its default. Read from the raw object, not validated: this runs on
    every watch event, and validating a spec (its reward lookup) costs tens of milliseconds."""
    written = (spec.get(section) or {}) if isinstance(spec.get(section), Mapping) else {}
    if key in written:
        return written[key]
    name = next(n for n, f in model.model_fields.items() if (f.alias or n) == key)
    return model.model_fields[name].default


def observe(namespace: str, name: str, rljob: Mapping[str, Any]) -> None:
    """Set the job's gauges from the RLJob as the watch delivered it."""
    status, spec = rljob.get("status") or {}, rljob.get("spec") or {}
    phase = status.get("phase") or "Pending"
    for each in PHASES:
        JOB_PHASE.labels(namespace, name, each).set(1.0 if each == phase else 0.0)
    values = {
        JOB_COST: status.get("costSoFar") or 0.0,
        JOB_COST_RATE: status.get("costPerHour") or 0.0,
        JOB_STEPS: status.get("stepsCompleted") or 0,
        JOB_STEPS_TOTAL: status.get("stepsTotal") or _field(spec, "algorithm", "steps", AlgorithmSpec),
        TRAINER_RESTARTS: status.get("trainerRestarts") or 0,
        TRAINER_BACKOFF_LIMIT: _field(spec, "trainer", "backoffLimit", TrainerSpec),
        JOB_BUDGET: spec.get("budget"),
    }
    for gauge, value in values.items():
        number = _number(value)
        if number is not None:
            gauge.labels(namespace, name).set(number)
        else:
            with contextlib.suppress(KeyError):  # unset (no budget) or not a number
                gauge.remove(namespace, name)


def forget(namespace: str, name: str) -> None:
    """The RLJob was deleted: its series go."""
    for each in PHASES:
        with contextlib.suppress(KeyError):
            JOB_PHASE.remove(namespace, name, each)
    for gauge in (*PER_JOB, JOB_SUSPENDING):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
