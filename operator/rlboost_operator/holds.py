"""Why an RLJob must be held at zero replicas, and the status of holding it (pure).

A job is held when its spec says `suspend: true`, or when it is queued in Kueue (label kueue.x-k8s.io/queue-name,
the operator's Kueue integration on) and Kueue has not admitted it or is evicting it. A held job that ran is
suspended (suspension.py: the trainer checkpoints at a step boundary, then every child goes to zero); one that never
ran goes to zero at once. Lifting the hold resumes it from that checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rlboost.spec import JobSpec
from rlboost_operator import kueue
from rlboost_operator.status import PENDING, RUNNING, condition, now_iso, set_condition

SUSPENDED = "Suspended"  # the phase, and the condition type
SPEC, WAITING, PREEMPTED = "Suspended", "WaitingForAdmission", "Preempted"  # the reasons


@dataclass(frozen=True)
class Hold:
    """Why the job is held: `reason` (SPEC, WAITING or PREEMPTED) and a sentence for the status and Events."""

    reason: str
    message: str


def hold_for(spec: JobSpec, queue: str, state: kueue.Admission | None) -> Hold | None:
    """The hold on a job: spec.suspend first; then Kueue's (`queue`: its LocalQueue, '' when not queued;
    `state`: its Workload as Kueue left it)."""
    if spec.suspend:
        return Hold(SPEC, "spec.suspend is true: set it to false to resume")
    if not queue or kueue.runs(state):
        return None
    if state is not None and state.evicted is not None and state.quota_reserved:
        reason, message = state.evicted
        return Hold(PREEMPTED, f"Kueue evicted Workload {state.name} ({reason}): {message}")
    name = state.name if state is not None else "(being created)"
    why = f": {state.waiting}" if state is not None and state.waiting else ""
    again = f" (requeued after an eviction: {state.evicted[0]})" if state is not None and state.evicted else ""
    return Hold(WAITING, f"waiting in LocalQueue {queue} for Kueue to admit Workload {name}{again}{why}")


def suspended(status: Mapping[str, Any]) -> bool:
    return status.get("phase") == SUSPENDED


def never_ran(status: Mapping[str, Any]) -> bool:
    """No pod of the job may hold a step not yet checkpointed: it has no status yet, or it is held already."""
    return status.get("phase") not in (PENDING, RUNNING)


def suspending_status(
    previous: Mapping[str, Any], hold: Hold, now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The .status patch while the trainer is asked to checkpoint before the job goes to zero."""
    message = f"{hold.message}; the trainer checkpoints at the end of the step in progress, then every child stops"
    cond = condition(SUSPENDED, False, "Suspending", message, now, generation)
    record = {"reason": hold.reason, "message": hold.message, "state": "Suspending", "requestedAt": now_iso(now)}
    return {"suspension": record, "conditions": set_condition(previous.get("conditions"), cond)}


def suspended_status(
    previous: Mapping[str, Any],
    hold: Hold,
    checkpointed_steps: int | None,
    now: datetime | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """The .status patch of a job held at zero: phase Suspended, why, and the steps its checkpoint holds (kept from
    the suspension that stopped it when only the reason changes, e.g. Preempted -> WaitingForAdmission)."""
    record = dict(previous.get("suspension") or {}) if suspended(previous) else {}
    record.setdefault("requestedAt", now_iso(now))
    record.setdefault("suspendedAt", now_iso(now))
    if not suspended(previous):
        record["checkpointedSteps"] = checkpointed_steps
    record.update(reason=hold.reason, message=hold.message, state=SUSPENDED)
    return {
        "phase": SUSPENDED,
        "suspension": record,
        "workers": {**dict(previous.get("workers") or {}), "reserved": 0, "spot": 0, "spotDesired": 0},
        "costPerHour": 0.0,
        "estimatedRemainingSeconds": None,
        "updatedAt": now_iso(now),
        "conditions": set_condition(
            previous.get("conditions"), condition(SUSPENDED, True, hold.reason, hold.message, now, generation)
        ),
    }


def resumed_status(
    previous: Mapping[str, Any], now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The .status patch of a suspended job whose hold was lifted: Pending until its first step report."""
    steps = (previous.get("suspension") or {}).get("checkpointedSteps")
    where = f"from the checkpoint after step {steps}" if steps else "from its newest checkpoint"
    record = {**dict(previous.get("suspension") or {}), "state": "Resumed", "resumedAt": now_iso(now)}
    cond = condition(SUSPENDED, False, "Resumed", f"resumed {where}", now, generation)
    return {"phase": PENDING, "suspension": record, "conditions": set_condition(previous.get("conditions"), cond)}


def cancelled_status(
    previous: Mapping[str, Any], now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The .status patch of a suspension lifted before the job stopped (suspend set back to false, or Kueue admitting
    it again): it keeps running, and the status stops saying it is being suspended."""
    record = {**dict(previous.get("suspension") or {}), "state": "Cancelled"}
    cond = condition(SUSPENDED, False, "Cancelled", "the suspension was lifted before the job stopped", now, generation)
    return {"suspension": record, "conditions": set_condition(previous.get("conditions"), cond)}
