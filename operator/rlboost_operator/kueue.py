"""Kueue admission, with the RLJob as an external framework (pure: manifests and decisions, no API calls).

An RLJob labelled `kueue.x-k8s.io/queue-name` gets one Workload (kueue.x-k8s.io/v1beta2) that the operator makes
and follows, doing for it what Kueue's jobframework does for the Job kinds built into Kueue (Kueue is configured with
`integrations.externalFrameworks: ["RLJob.v1alpha1.rlboost.io"]`, docs/kubernetes.md):

- the Workload asks for every pod the job runs but its spot workers, one podSet per workload: the trainer ranks
  (count = trainer.ranks), the rollout-manager, the weight-server, the job's NATS and the reserved workers. Kueue
  admits a Workload whole, so the trainer ranks are admitted together with everything they need (a gang);
- until Kueue admits it (condition Admitted) the job is held at zero replicas (suspension.py): it waits in its queue
  holding no accelerator; once admitted its pods get the node labels and tolerations of the ResourceFlavors Kueue
  assigned to each podSet, as jobframework's RunWithPodSetsInfo gives them;
- an eviction (condition Evicted, e.g. Preempted) suspends the job as spec.suspend does (the trainer checkpoints at a
  step boundary first), then the operator releases the quota (QuotaReserved=False, no admission, Requeued) as
  jobframework does once a job stopped; Kueue requeues it, and a new admission resumes it bit-exactly;
- the job's end marks the Workload Finished (Succeeded or Failed), which frees the quota.

The spot workers are left out of the Workload on purpose: their Deployments are owned by the RLJob without being
its controller, so Kueue's deployment integration (on by default since Kueue 0.15) admits each spot pod on its own,
against the ResourceFlavor its spot node selector matches. Spot workers thus come and go with the quota (a pod
waiting for admission is scheduling-gated and holds nothing), and a Kueue preemption of one is a spot preemption,
which the rollout-manager already survives (its tokens migrate).

The podSet templates carry only what admission reads (requests, limits, node selectors, affinity, tolerations), and
the Workload's name carries a digest of them: an edit that changes what the job asks for makes a new Workload while
the job is not admitted (the old one is deactivated), and takes effect at the next admission while it runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
ADMITTED, QUOTA_RESERVED, EVICTED, FINISHED, REQUEUED = "Admitted", "QuotaReserved", "Evicted", "Finished", "Requeued"
REQUEUED_REASONS = ("Preempted", "NodeFailures")  # jobframework requeues after these evictions
POD_SET_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName")
CONTAINER_FIELDS = ("name", "resources")


def queue_name(labels: Mapping[str, str] | None) -> str:
    return (labels or {}).get(QUEUE_LABEL, "")


def priority_class(labels: Mapping[str, str] | None) -> str:
    return (labels or {}).get(PRIORITY_LABEL, "")


# --- the Workload ---------------------------------------------------------------------------------------


def pod_set_name(obj: Mapping[str, Any]) -> str:
    """A child workload's podSet: its component, and its pool for the reserved workers."""
    labels = obj["metadata"]["labels"]
    component = labels["app.kubernetes.io/component"]
    return f"{labels['rlboost.io/pool']}-workers" if component == "rollout-worker" else component


def is_spot(obj: Mapping[str, Any]) -> bool:
    return obj["kind"] == "Deployment" and obj["metadata"]["labels"].get("rlboost.io/pool") == "spot"


def gang(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children admitted together: every workload with replicas but the spot Deployments."""
    return [
        o for o in objs if o["kind"] in ("Deployment", "StatefulSet") and not is_spot(o) and o["spec"]["replicas"] > 0
    ]


def _admission_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What Kueue's admission reads of a pod: its containers' requests and limits and where it may run."""
    out: dict[str, Any] = {k: pod[k] for k in POD_SET_FIELDS if k in pod}
    for key in ("initContainers", "containers"):
        if pod.get(key):
            out[key] = [{k: c[k] for k in CONTAINER_FIELDS if k in c} for c in pod[key]]
    return out


def pod_sets(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": pod_set_name(o),
            "count": o["spec"]["replicas"],
            "template": {"spec": _admission_view(o["spec"]["template"]["spec"])},
        }
        for o in gang(objs)
    ]


def workload_name(job: str, spec: Mapping[str, Any]) -> str:
    """`rljob-<job>-<digest of what it asks for>` (a DNS subdomain, at most 253 characters)."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return f"rljob-{job[: 253 - 15]}-{digest}"


def workload(
    job: str, namespace: str, objs: list[dict[str, Any]], labels: Mapping[str, str], priority: int | None
) -> dict[str, Any]:
    """The job's Workload (unowned: the caller adopts it), asking for `objs` (the children as they run);
    `priority`: the value of the WorkloadPriorityClass its label names (None: no label)."""
    spec: dict[str, Any] = {"queueName": queue_name(labels), "podSets": pod_sets(objs)}
    if priority is not None:
        ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": priority_class(labels)}
        spec.update(priorityClassRef=ref, priority=priority)
    meta = {
        "name": workload_name(job, spec),
        "namespace": namespace,
        "labels": {**labels, "rlboost.io/job": job, "app.kubernetes.io/managed-by": "rlboost-operator"},
    }
    return {"apiVersion": API_VERSION, "kind": "Workload", "metadata": meta, "spec": {**spec, "active": True}}


# --- what Kueue decided ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Admission:
    """A Workload's state as Kueue left it."""

    name: str
    admitted: bool = False
    quota_reserved: bool = False
    evicted: tuple[str, str] | None = None  # (reason, message) of an Evicted=True condition
    finished: bool = False
    cluster_queue: str = ""
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)  # podSet -> resource -> ResourceFlavor
    waiting: str = ""  # QuotaReserved=False's message: why it waits

    def flavor_names(self) -> set[str]:
        return {name for per_resource in self.flavors.values() for name in per_resource.values()}


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in ((obj.get("status") or {}).get("conditions") or [])}


def _true(conds: Mapping[str, Mapping[str, Any]], kind: str) -> bool:
    return conds.get(kind, {}).get("status") == "True"


def admission(obj: Mapping[str, Any]) -> Admission:
    conds, state = _conditions(obj), (obj.get("status") or {}).get("admission") or {}
    evicted = conds.get(EVICTED) if _true(conds, EVICTED) else None
    return Admission(
        name=obj["metadata"]["name"],
        admitted=_true(conds, ADMITTED),
        quota_reserved=_true(conds, QUOTA_RESERVED),
        evicted=(evicted.get("reason", ""), evicted.get("message", "")) if evicted else None,
        finished=_true(conds, FINISHED),
        cluster_queue=state.get("clusterQueue", ""),
        flavors={a["name"]: dict(a.get("flavors") or {}) for a in state.get("podSetAssignments") or []},
        waiting="" if _true(conds, QUOTA_RESERVED) else conds.get(QUOTA_RESERVED, {}).get("message", ""),
    )


def runs(state: Admission | None) -> bool:
    """Whether Kueue lets the job run now: admitted, not being evicted."""
    return state is not None and state.admitted and state.evicted is None


def place(objs: list[dict[str, Any]], state: Admission, flavors: Mapping[str, Mapping[str, Any]]) -> None:
    """Each admitted podSet's pod template gets its ResourceFlavors' node labels (nodeSelector) and tolerations
    (`flavors`: name -> the ResourceFlavor's spec), in place."""
    for obj in gang(objs):
        chosen = [flavors.get(name) or {} for name in dict.fromkeys(state.flavors.get(pod_set_name(obj), {}).values())]
        pod = obj["spec"]["template"]["spec"]
        for flavor in chosen:
            if flavor.get("nodeLabels"):
                pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **flavor["nodeLabels"]}
            if flavor.get("tolerations"):
                pod["tolerations"] = [*(pod.get("tolerations") or []), *flavor["tolerations"]]


# --- what the operator writes back ----------------------------------------------------------------------


def _condition(obj: Mapping[str, Any], kind: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    old = _conditions(obj).get(kind) or {}
    status = "True" if ok else "False"
    since = old.get("lastTransitionTime") if old.get("status") == status else now
    generation = (obj.get("metadata") or {}).get("generation")
    out = {"type": kind, "status": status, "reason": reason, "message": message[:32768], "lastTransitionTime": since}
    return {**out, "observedGeneration": generation} if generation is not None else out


def _with(obj: Mapping[str, Any], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Workload's conditions with `new` replacing those of their types (a merge patch replaces the list)."""
    kinds = {c["type"] for c in new}
    return [dict(c) for c in ((obj.get("status") or {}).get("conditions") or []) if c.get("type") not in kinds] + new


def released_status(obj: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The status patch that gives an evicted Workload's quota back once the job stopped (jobframework: Requeued
    after a preemption, QuotaReserved=False, no admission, Admitted=False)."""
    when = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    reason, message = admission(obj).evicted or ("Evicted", "")
    new = [
        _condition(obj, REQUEUED, reason in REQUEUED_REASONS, reason, message, when),
        _condition(obj, QUOTA_RESERVED, False, "Pending", message, when),
        _condition(obj, ADMITTED, False, "NoReservation", "The workload has no reservation", when),
    ]
    return {"admission": None, "conditions": _with(obj, new)}


def finished_status(obj: Mapping[str, Any], ok: bool, message: str, now: datetime) -> dict[str, Any]:
    """The status patch of a Workload whose job ended (Finished frees its quota)."""
    when = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    new = [_condition(obj, FINISHED, True, "Succeeded" if ok else "Failed", message, when)]
    return {"conditions": _with(obj, new)}
