"""The cluster lane's stand-in for Kueue (`scripts/cluster_e2e.py --kueue`), because Kueue itself cannot run here:
its controller is a Go program that needs a real API server and its own admission webhooks, and the lane's API is
kmock. So the lane plays Kueue's part, and this module is exactly where that begins:

- it registers minimal CustomResourceDefinitions for Kueue's Workload (with its status subresource),
  ResourceFlavor and WorkloadPriorityClass (names and scope only; no schema, no validation, no webhooks);
- it makes one ResourceFlavor, `lane-on-demand`, whose node labels the lane's reserved node carries;
- `admit` writes on a Workload what Kueue's scheduler writes when it admits one: status.admission (the ClusterQueue
  `lane-cq` and that flavor for every podSet's resources) and QuotaReserved and Admitted True (Evicted False when
  it had been evicted: Kueue resets it at the next admission);
- `preempt` writes what Kueue's preemptor writes on a Workload it evicts: Evicted True, reason Preempted.

It does not do any of Kueue's decisions: no quota, ClusterQueues, LocalQueues, cohorts, priorities or fair sharing
(the lane decides when to admit and when to preempt), no gating and admitting of each spot pod on its own (Kueue's
deployment integration: the lane's spot pods start at once, as if each were admitted). Everything the operator does
about the Workload (making it, holding the job at zero until admitted, placing the pods on the flavor's node labels,
suspending the job after its trainer checkpointed, giving the quota back) is the product's own code.
"""

from __future__ import annotations

from typing import Any

import httpx

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API = f"/apis/{GROUP}/{VERSION}"
FLAVOR, FLAVOR_LABEL = "lane-on-demand", ("rlboost.io/lane-pool", "on-demand")
CLUSTER_QUEUE = "lane-cq"
MERGE = {"Content-Type": "application/merge-patch+json"}
KINDS = (("Workload", "workloads", "Namespaced"), ("ResourceFlavor", "resourceflavors", "Cluster"))
KINDS += (("WorkloadPriorityClass", "workloadpriorityclasses", "Cluster"),)


def crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    version = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
        **({"subresources": {"status": {}}} if kind == "Workload" else {}),
    }
    names = {"kind": kind, "plural": plural, "singular": kind.lower()}
    spec = {"group": GROUP, "scope": scope, "names": names, "versions": [version]}
    meta = {"name": f"{plural}.{GROUP}"}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": meta, "spec": spec}


class KueueStandIn:
    """Kueue's part in the lane, on the lane's API client."""

    def __init__(self, http: httpx.Client, namespace: str) -> None:
        self.http, self.namespace = http, namespace

    def install(self) -> None:
        """The CRDs and the ResourceFlavor (as a cluster with Kueue installed and configured has them)."""
        for kind, plural, scope in KINDS:
            self.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd(kind, plural, scope))
        flavor = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": dict([FLAVOR_LABEL])},
        }
        self.http.post(f"{API}/resourceflavors", json=flavor).raise_for_status()

    def workload(self, name: str) -> dict[str, Any] | None:
        resp = self.http.get(f"{API}/namespaces/{self.namespace}/workloads/{name}")
        return resp.json() if resp.status_code == 200 else None

    def _write_status(self, name: str, status: dict[str, Any]) -> None:
        path = f"{API}/namespaces/{self.namespace}/workloads/{name}/status"
        self.http.patch(path, json={"status": status}, headers=MERGE).raise_for_status()

    def admit(self, wl: dict[str, Any]) -> None:
        """What Kueue's scheduler writes when it admits the Workload."""
        flavors = lambda pod_set: {r: FLAVOR for r in _resources(pod_set)}  # noqa: E731
        assignments = [{"name": p["name"], "count": p["count"], "flavors": flavors(p)} for p in wl["spec"]["podSets"]]
        conditions = [
            _condition("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}"),
            _condition("Admitted", True, "Admitted", "The workload is admitted"),
        ]
        if any(c["type"] == "Evicted" for c in (wl.get("status") or {}).get("conditions") or []):
            conditions.append(_condition("Evicted", False, "QuotaReserved", "Previously: Preempted"))
        admission = {"clusterQueue": CLUSTER_QUEUE, "podSetAssignments": assignments}
        self._write_status(wl["metadata"]["name"], {"admission": admission, "conditions": conditions})

    def preempt(self, wl: dict[str, Any]) -> None:
        """What Kueue's preemptor writes on the Workload it evicts."""
        kept = [c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") != "Evicted"]
        message = "Preempted to accommodate a workload (UID: lane) due to prioritization in the ClusterQueue"
        evicted = _condition("Evicted", True, "Preempted", message)
        self._write_status(wl["metadata"]["name"], {"conditions": [*kept, evicted]})


def _resources(pod_set: dict[str, Any]) -> list[str]:
    """The resources a podSet's containers request (every one gets the flavor)."""
    spec = pod_set["template"]["spec"]
    names = {r for c in [*spec.get("initContainers", []), *spec["containers"]] for r in c["resources"]["requests"]}
    return sorted(names)


def _condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason, "message": message}


def admitted(wl: dict[str, Any] | None) -> bool:
    conds = {c["type"]: c["status"] for c in ((wl or {}).get("status") or {}).get("conditions") or []}
    return conds.get("Admitted") == "True" and conds.get("Evicted") != "True"


def quota_released(wl: dict[str, Any] | None) -> bool:
    """The operator gave an evicted Workload's quota back (no admission, QuotaReserved False)."""
    status = (wl or {}).get("status") or {}
    conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status.get("admission") is None and conds.get("QuotaReserved") == "False"
