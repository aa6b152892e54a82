"""Pure spot-pool logic: which Nodes are spot (per cloud), their capacity for a pool, and preemption signals.

Nodes are plain dicts as the Kubernetes API returns them. Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlboost.spec import PoolSpec, SpotPoolSpec, split_spot_workers

# Spot labels by provider: (label, value).
SPOT_LABELS: dict[str, tuple[str, str]] = {
    "gke": ("cloud.google.com/gke-spot", "true"),
    "gke-preemptible": ("cloud.google.com/gke-preemptible", "true"),
    "eks": ("eks.amazonaws.com/capacityType", "SPOT"),
    "karpenter": ("karpenter.sh/capacity-type", "spot"),
    "aks": ("kubernetes.azure.com/scalesetpriority", "spot"),
}

# Preemption taints: key -> (reason, seconds from the signal to the node's end).
PREEMPTION_TAINTS: dict[str, tuple[str, float]] = {
    "cloud.google.com/impending-node-termination": ("gke-termination", 30.0),
    "aws-node-termination-handler/spot-itn": ("aws-spot-interruption", 120.0),
    "aws-node-termination-handler/rebalance-recommendation": ("aws-rebalance-recommendation", 600.0),
    "karpenter.sh/disrupted": ("karpenter-disrupted", 30.0),
    "ToBeDeletedByClusterAutoscaler": ("cluster-autoscaler-scale-down", 30.0),
    "kubernetes.azure.com/scalesetpriority-eviction": ("aks-spot-eviction", 30.0),
}

ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "google.com/tpu")


@dataclass(frozen=True)
class Preemption:
    """A node about to go away: why, and how many seconds remain."""

    node: str
    reason: str
    deadline_s: float


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return node.get("metadata", {}).get("labels") or {}


def spot_provider(node: Mapping[str, Any]) -> str | None:
    """The provider whose spot label the node carries ('gke', 'eks', 'karpenter', 'aks'), or None."""
    labels = _labels(node)
    for provider, (key, value) in SPOT_LABELS.items():
        if labels.get(key, "").lower() == value.lower():
            return provider.split("-")[0]
    return None


def is_ready(node: Mapping[str, Any]) -> bool:
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def accelerators(node: Mapping[str, Any]) -> int:
    """Accelerators the node can give to pods (allocatable, else capacity)."""
    status = node.get("status", {})
    res = status.get("allocatable") or status.get("capacity") or {}
    total = 0
    for name in ACCELERATOR_RESOURCES:
        try:
            total += int(str(res.get(name, "0")))
        except ValueError:
            continue
    return total


def preemption(node: Mapping[str, Any], deleted: bool = False) -> Preemption | None:
    """The strongest preemption signal on a node: deletion, a provider taint, NotReady or unschedulable."""
    name = node.get("metadata", {}).get("name", "")
    if deleted or node.get("metadata", {}).get("deletionTimestamp"):
        return Preemption(name, "node-deleted", 0.0)
    found: list[Preemption] = []
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("key") in PREEMPTION_TAINTS:
            reason, deadline = PREEMPTION_TAINTS[taint["key"]]
            found.append(Preemption(name, reason, deadline))
    if found:
        return min(found, key=lambda p: p.deadline_s)
    if node.get("status", {}).get("conditions") and not is_ready(node):
        return Preemption(name, "node-not-ready", 0.0)
    if node.get("spec", {}).get("unschedulable"):
        return Preemption(name, "node-unschedulable", 30.0)
    return None


def matches_pool(node: Mapping[str, Any], pool: PoolSpec) -> bool:
    """A spot node serving this pool: spot-labelled and carrying every label of the pool's nodeSelector."""
    labels = _labels(node)
    return spot_provider(node) is not None and all(labels.get(k) == v for k, v in pool.node_selector.items())


def node_slots(node: Mapping[str, Any], pool: PoolSpec) -> int:
    """Workers of this pool that fit on one usable node: accelerators // gpusPerWorker, or 1 on CPU pools."""
    if not matches_pool(node, pool) or not is_ready(node) or preemption(node) is not None:
        return 0
    if pool.gpus_per_worker == 0:
        return 1
    return accelerators(node) // pool.gpus_per_worker


def spot_capacity(nodes: Iterable[Mapping[str, Any]], pool: PoolSpec) -> int:
    """Workers of this pool that the spot nodes present can hold (a pool with variants: theirs together)."""
    if isinstance(pool, SpotPoolSpec) and pool.variants:
        return sum(variant_capacity(nodes, pool).values())
    return sum(node_slots(n, pool) for n in nodes)


def variant_capacity(nodes: Iterable[Mapping[str, Any]], pool: SpotPoolSpec) -> dict[str, int]:
    """Workers of each variant of the spot pool that its nodes present hold, at most its maxReplicas."""
    nodes = list(nodes)
    return {v.name: min(v.max_replicas, spot_capacity(nodes, pool.variant_pool(v.name))) for v in pool.variants}


def variant_split(
    nodes: Iterable[Mapping[str, Any]], pool: SpotPoolSpec, total: int, placed: Mapping[str, int] | None = None
) -> dict[str, int]:
    """The spot ask `total` per variant ({} without variants): rlboost.spec.split_spot_workers, first bounded by
    what each variant's nodes hold, or, for an autoscaled pool (`placed`: its pods that have a node, per variant),
    by the pods each has placed, so that an ask shrunk after pods stayed unschedulable keeps the placed workers
    and puts only the rest (the probe) on the cheapest variant with room."""
    if not pool.variants:
        return {}
    return split_spot_workers(total, pool.variants, placed if placed is not None else variant_capacity(nodes, pool))


def spot_accelerators(nodes: Iterable[Mapping[str, Any]], pool: PoolSpec) -> int:
    """Accelerators on usable spot nodes of this pool."""
    return sum(accelerators(n) for n in nodes if node_slots(n, pool) > 0)


def desired_spot_replicas(nodes: Iterable[Mapping[str, Any]], pool: PoolSpec) -> int:
    """The spot Deployment's replicas: the capacity that exists, clamped to [minReplicas, maxReplicas]."""
    return max(pool.min_replicas, min(pool.max_replicas, spot_capacity(nodes, pool)))


def spot_scheduling(pool: PoolSpec) -> dict[str, Any]:
    """nodeSelector, tolerations and affinity putting a pool's pods on spot nodes of any supported cloud."""
    terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in SPOT_LABELS.values()]
    tolerations = [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k, _ in SPOT_LABELS.values()]
    if pool.gpus_per_worker:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return {
        "nodeSelector": dict(pool.node_selector),
        "tolerations": tolerations,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}},
    }


def off_spot_affinity() -> dict[str, Any]:
    """Node affinity that keeps a pod off spot nodes of every supported cloud (NotIn also matches nodes without
    the label). The trainer, the manager and the weight-server get it: a preemption must not take them down."""
    exprs = [{"key": k, "operator": "NotIn", "values": [v]} for k, v in SPOT_LABELS.values()]
    terms = [{"matchExpressions": exprs}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def reserved_scheduling(pool: PoolSpec) -> dict[str, Any]:
    """Keep reserved workers off spot nodes."""
    out: dict[str, Any] = {"nodeSelector": dict(pool.node_selector), "affinity": off_spot_affinity()}
    if pool.gpus_per_worker:
        out["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return out


def colocated_scheduling(
    pool: PoolSpec, trainer_selector: dict[str, str], worker_selector: dict[str, str]
) -> dict[str, Any]:
    """trainer.colocateReserved: each reserved worker on the node of a trainer rank, one per node.

    The worker shares that rank's accelerators: on GPUs the node pool must share them between containers
    (GKE GPU time-sharing or MPS, the NVIDIA device plugin's time-slicing on EKS), so the worker's own
    `nvidia.com/gpu` request is a share of the same devices; it frees its memory while the rank trains."""
    out = reserved_scheduling(pool)
    same_node = {"labelSelector": {"matchLabels": trainer_selector}, "topologyKey": "kubernetes.io/hostname"}
    own = {"labelSelector": {"matchLabels": worker_selector}, "topologyKey": "kubernetes.io/hostname"}
    out["affinity"]["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [same_node]}
    out["affinity"]["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [own]}
    return out
