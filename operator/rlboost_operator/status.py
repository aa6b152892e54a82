"""Pure status computations for an RLJob: phase, conditions, cost so far and cost efficiency.

Accelerators counted (JobSpec.cost_per_hour): trainer ranks x gpusPerRank and reserved workers x gpusPerWorker at
the reserved price, ready spot workers x gpusPerWorker at the spot price, or, for a spot pool with variants, each
variant's ready workers x its gpusPerWorker at its pricePerGpuHour. CPU-only jobs cost 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from rlboost.spec import JobSpec, SpotWorkers
from rlboost.wire.events import JobDone, StepReport, ValidationReport

PENDING, RUNNING, SUCCEEDED, FAILED = "Pending", "Running", "Succeeded", "Failed"
HELD = "Suspended"  # a held job's phase (holds.py): a step report arriving late does not make it Running
TERMINAL = {SUCCEEDED, FAILED}
ENDED = ("Complete", "Failed")  # condition types of a job that ran to its end
STOPPED = "Stopped"  # condition type: the job's pods are scaled to zero
KEPT = "checkpoints (PVCs), the token Secret, the ConfigMap and this status are kept"


def now_iso(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def condition(
    kind: str, ok: bool, reason: str, message: str, now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """A status condition as Kubernetes API conventions have it; `generation`: the RLJob's metadata.generation
    the condition was judged on (written as observedGeneration, so a client can tell a stale one)."""
    out: dict[str, Any] = {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_iso(now),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def set_condition(conditions: list[Mapping[str, Any]] | None, new: dict[str, str]) -> list[dict[str, Any]]:
    """Replace the condition of the same type; keep its transition time when its status did not change."""
    out: list[dict[str, Any]] = []
    for cond in conditions or []:
        if cond.get("type") == new["type"]:
            if cond.get("status") == new["status"]:
                new = {**new, "lastTransitionTime": cond.get("lastTransitionTime", new["lastTransitionTime"])}
            continue
        out.append(dict(cond))
    out.append(new)
    return out


def accelerator_counts(spec: JobSpec, reserved_workers: int, spot_workers: SpotWorkers) -> tuple[int, int]:
    """(reserved accelerators, spot accelerators) in use."""
    return spec.accelerators(reserved_workers, spot_workers)


def cost_per_hour(spec: JobSpec, reserved_workers: int, spot_workers: SpotWorkers) -> float:
    return spec.cost_per_hour(reserved_workers, spot_workers)


def variant_list(counts: Mapping[str, int], key: str) -> list[dict[str, Any]]:
    """Per-variant counts as status.workers lists them ([{name, <key>}]: a list, which a merge patch replaces
    whole, so a variant removed from the spec leaves the status too)."""
    return [{"name": name, key: n} for name, n in counts.items()]


def accumulate_cost(cost_so_far: float, rate_per_hour: float, since: datetime | None, now: datetime) -> float:
    """Cost so far plus the rate integrated since the last update (nothing if this is the first)."""
    if since is None or now <= since:
        return cost_so_far
    return cost_so_far + rate_per_hour * (now - since).total_seconds() / 3600.0


def cost_efficiency(tokens_per_second: float, rate_per_hour: float) -> float:
    """Response tokens per USD; 0 when nothing is paid (CPU-only jobs)."""
    if rate_per_hour <= 0:
        return 0.0
    return tokens_per_second * 3600.0 / rate_per_hour


def _json_number(value: float, digits: int) -> float | None:
    """Rounded, or None (the merge patch drops the field) when not finite: the API server takes strict JSON only,
    and a StepReport may carry a NaN reward (values computed from the model are reported, not rejected)."""
    return round(value, digits) if math.isfinite(value) else None


def progress(completed: int, total: int, step_seconds: float | None = None) -> dict[str, Any]:
    """Steps completed against the total, as Kubeflow Trainer reports a TrainJob's progress: `12/12` for a finished
    12-step job (status.step holds the last step's 0-based index, 11). `step_seconds`: the last step's wall time,
    for the estimate of the time left (None: no estimate)."""
    left = max(0, total - completed)
    out: dict[str, Any] = {
        "stepsCompleted": completed,
        "stepsTotal": total,
        "progress": f"{completed}/{total}",
        "progressPercentage": min(100, completed * 100 // total) if total > 0 else 0,
    }
    if step_seconds is not None or not left:
        out["estimatedRemainingSeconds"] = round(left * (step_seconds or 0.0))
    return out


def validation_status(v: ValidationReport) -> dict[str, Any]:
    """`.status.validation`: the last evaluation on the validation prompts (spec.evaluation)."""
    return {
        "step": v.step,
        "weightVersion": v.weight_version,
        "k": v.k,
        "prompts": v.prompts,
        "rewardMean": _json_number(v.reward_mean, 6),
        "passAt1": _json_number(v.pass_at_1, 6),
        "passAtK": _json_number(v.pass_at_k, 6),
        "responseTokensMean": _json_number(v.response_tokens_mean, 3),
    }


def step_status(
    report: StepReport,
    spec: JobSpec,
    workers: Mapping[str, int],
    previous: Mapping[str, Any],
    now: datetime | None = None,
    generation: int | None = None,
    spot_variants: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The .status patch after a StepReport: step, reward, tokens/s, workers, cost; phase Running.
    `spot_variants`: ready spot workers per variant (a spot pool with variants), each priced at its own price."""
    now = now or datetime.now(UTC)
    seconds = report.rollout_seconds + report.train_seconds + report.sync_seconds
    tps = report.tokens / seconds if seconds > 0 else 0.0
    held = previous.get("phase") == HELD  # a report that arrives once the job is suspended: nothing runs or costs
    reserved, spot = (0, 0) if held else (int(workers.get("reserved", 0)), int(workers.get("spot", 0)))
    spot_variants = None if held else spot_variants
    rate = 0.0 if held else cost_per_hour(spec, reserved, spot_variants if spot_variants is not None else spot)
    variants = {"spotVariants": variant_list(spot_variants, "ready")} if spot_variants is not None else {}
    # Integrate at the previous rate: it was the one in force since the previous update.
    prev_rate = 0.0 if held else float(previous.get("costPerHour") or rate)
    so_far = accumulate_cost(
        float(previous.get("costSoFar") or 0.0), prev_rate, parse_iso(previous.get("updatedAt")), now
    )
    phase = previous.get("phase") if previous.get("phase") in (*TERMINAL, HELD) else RUNNING
    validation = {"validation": validation_status(report.validation)} if report.validation is not None else {}
    return {
        **validation,
        **progress(report.step + 1, spec.algorithm.steps, None if held else seconds),
        "phase": phase,
        "step": report.step,
        "weightVersion": report.weight_version,
        "rewardMean": _json_number(report.reward_mean, 6),
        "tokensPerSecond": _json_number(tps, 3),
        "workers": {**dict(previous.get("workers") or {}), "reserved": reserved, "spot": spot, **variants},
        "costPerHour": _json_number(rate, 6),
        "costSoFar": _json_number(so_far, 6),
        "costEfficiency": _json_number(cost_efficiency(tps, rate), 3),
        "preemptedSlotShare": _json_number(report.preempted_slot_share, 4),
        "updatedAt": now_iso(now),
        "conditions": budget_condition(
            set_condition(
                previous.get("conditions"),
                condition("Running", True, "StepReported", f"step {report.step} finished", now, generation),
            ),
            so_far,
            spec.budget,
            now,
            generation,
        ),
    }


BUDGET = "BudgetExceeded"  # condition type


def budget_condition(
    conditions: list[dict[str, Any]],
    so_far: float,
    budget: float | None,
    now: datetime | None = None,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """`conditions` with BudgetExceeded (True once status.costSoFar passed spec.budget); unchanged without one."""
    if budget is None:
        return conditions
    over = so_far > budget
    message = f"spent {so_far:.2f} USD of spec.budget {budget:.2f} USD" + ("; suspend the job to stop" if over else "")
    return set_condition(
        conditions, condition(BUDGET, over, "OverBudget" if over else "WithinBudget", message, now, generation)
    )


def done_status(
    done: JobDone, previous: Mapping[str, Any], now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The .status patch when the trainer reports the end: Succeeded or Failed with its error."""
    ok = done.ok
    msg = f"finished {done.steps} steps" if ok else f"trainer failed: {done.error or 'no error given'}"
    reason = "TrainerDone" if ok else "TrainerFailed"
    cond = condition("Complete" if ok else "Failed", True, reason, msg, now, generation)
    out = {
        "phase": SUCCEEDED if ok else FAILED,
        "updatedAt": now_iso(now),
        "conditions": set_condition(previous.get("conditions"), cond),
    }
    # The last step, from `done` itself: step reports and `done` arrive on two subscriptions, so the last reports
    # may be handled after `done`, when an ended job's status no longer takes them (the lane saw 19 of 40).
    if ok and done.steps > 0:
        out["step"] = done.steps - 1
    if ok:
        out.update(progress(done.steps, int(previous.get("stepsTotal") or done.steps)))
    return out


def invalid_status(
    field: str, message: str, previous: Mapping[str, Any] | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """The .status of an RLJob that cannot run: Failed, with a condition naming the field. A job that already
    ended keeps its phase and conditions (an edit after the end does not rewrite how it ended)."""
    where = field if field.startswith("metadata.") else f"spec.{field}"  # a label is outside the spec
    invalid = condition("Valid", False, "InvalidSpec", f"{where}: {message}", now)
    if previous is not None and finished(previous):
        return {"updatedAt": now_iso(now), "conditions": set_condition(previous.get("conditions"), invalid)}
    return {"phase": FAILED, "updatedAt": now_iso(now), "conditions": [invalid]}


def finished(status: Mapping[str, Any]) -> bool:
    """Whether the job ran to its end (the trainer's `done`, its back-off exhausted, or its model fetcher gave up):
    it stays scaled to zero for good. Failed for an invalid spec, or for a claim or Secret not there yet, is not an
    end: fixing the spec, or creating what is missing, runs the job."""
    if status.get("phase") not in TERMINAL:
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") in ENDED and c.get("status") == "True" for c in conditions)


def reconcile_status(
    previous: Mapping[str, Any],
    spot_desired: int,
    generation: int | None = None,
    now: datetime | None = None,
    steps_total: int | None = None,
) -> dict[str, Any]:
    """The .status patch after the children were reconciled: Valid, the spot ask, the generation seen, the progress
    against `steps_total` (spec.algorithm.steps); Pending for a new job or one whose spec was fixed; an ended job
    keeps its phase."""
    patch: dict[str, Any] = {
        "workers": {**dict(previous.get("workers") or {}), "spotDesired": spot_desired},
        "conditions": set_condition(
            previous.get("conditions"),
            condition("Valid", True, "SpecAccepted", "spec is valid; children reconciled", now, generation),
        ),
        "updatedAt": now_iso(now),
        "observedGeneration": generation,
        "startedAt": previous.get("startedAt") or now_iso(now),
    }
    if previous.get("phase") in (None, FAILED) and not finished(previous):
        patch["phase"] = PENDING
    if steps_total is not None and not finished(previous):
        patch.update(progress(int(previous.get("stepsCompleted") or 0), steps_total))
    return patch


def worker_identity_status(
    previous: Mapping[str, Any],
    ok: bool,
    reason: str,
    message: str,
    generation: int | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The .status patch saying whether the job's manager has the cluster's keys to check worker identities
    (condition WorkerIdentityReady); the phase is left as it is (a job waiting for them stays Pending)."""
    cond = condition("WorkerIdentityReady", ok, reason, message, now, generation)
    return {"updatedAt": now_iso(now), "conditions": set_condition(previous.get("conditions"), cond)}


def stopped_status(
    previous: Mapping[str, Any], reason: str, now: datetime | None = None, generation: int | None = None
) -> dict[str, Any]:
    """The .status patch once an ended job's pods are scaled to zero: no workers, no cost, a Stopped condition."""
    workers = {**dict(previous.get("workers") or {}), "reserved": 0, "spot": 0, "spotDesired": 0}
    message = f"trainer, rollout workers, manager and weight-server scaled to zero; {KEPT}"
    return {
        "workers": workers,
        "costPerHour": 0.0,
        "updatedAt": now_iso(now),
        "conditions": set_condition(
            previous.get("conditions"), condition(STOPPED, True, reason, message, now, generation)
        ),
    }


def trainer_failures(pod: Mapping[str, Any]) -> int:
    """How often a trainer pod's container restarted after dying: its restartCount, less one when the last exit
    was clean (code 0: the trainer finished, which its `done` message reports; that is no failure)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == "trainer":
            count = int(cs.get("restartCount") or 0)
            last = (cs.get("lastState") or {}).get("terminated") or {}
            return max(0, count - 1) if last.get("exitCode") == 0 else count
    return 0


def backoff_exceeded(failures: int, limit: int) -> bool:
    """trainer.backoffLimit: that many restarts are tolerated, one more fails the job."""
    return failures > limit


def backoff_status(
    failures: int,
    limit: int,
    previous: Mapping[str, Any],
    now: datetime | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """The .status patch of a job whose trainer kept dying: Failed, with the count and the limit."""
    message = (
        f"the trainer restarted {failures} times after failures, more than trainer.backoffLimit ({limit}); "
        "see its pods' logs (kubectl logs --previous)"
    )
    cond = condition("Failed", True, "BackoffLimitExceeded", message, now, generation)
    return {"phase": FAILED, "updatedAt": now_iso(now), "conditions": set_condition(previous.get("conditions"), cond)}


def model_failed_status(
    field: str,
    reason: str,
    message: str,
    previous: Mapping[str, Any],
    now: datetime | None = None,
    generation: int | None = None,
    ended: bool = False,
) -> dict[str, Any]:
    """The .status of an RLJob whose model cannot be had (no such claim, refused token, unreachable URI...): Failed,
    with a ModelReady=False condition whose message names the spec.model field.

    `ended`: the job's `fetch-model` init container gave up (the source cannot be used, or stayed unreachable), so
    Failed=True (reason ModelUnavailable) as well: the job has ended like one past its back-off limit, scaled to zero
    and Failed for good (an operator restart does not revive it; spec.model cannot change, so the fix is a new
    RLJob once the source or its credentials are right). Without it (a claim or Secret not there yet) the job
    starts once what it missed exists."""
    conditions = set_condition(
        previous.get("conditions"),
        condition("ModelReady", False, reason, f"spec.model.{field}: {message}", now, generation),
    )
    if ended:
        text = f"spec.model.{field}: {message}; fix the source or its credentials, then re-create the RLJob"
        conditions = set_condition(conditions, condition("Failed", True, "ModelUnavailable", text, now, generation))
    return {"phase": FAILED, "updatedAt": now_iso(now), "conditions": conditions}


def generation(obj: Any) -> int | None:
    """metadata.generation of an RLJob (a kopf Body or a plain dict); None where the API server sets none."""
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if value is not None else None
