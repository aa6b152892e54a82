"""Every child of an RLJob, in creation order: the per-kind builders put together, services before workloads,
each pod template annotated with its config hash, retained PVCs unowned, and an ended job's workloads at zero."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlboost.spec import JobSpec
from rlboost_operator.children.disruption import disruption_budgets
from rlboost_operator.children.env_runner import env_runners
from rlboost_operator.children.job_config import annotate_config_hash, config_map
from rlboost_operator.children.job_labels import with_job_labels
from rlboost_operator.children.manager import manager
from rlboost_operator.children.nats import nats
from rlboost_operator.children.network_policy import network_policy
from rlboost_operator.children.policy import apply_policies
from rlboost_operator.children.service_accounts import service_accounts
from rlboost_operator.children.trainer import trainer
from rlboost_operator.children.weight_server import weight_server
from rlboost_operator.children.worker import initial_reserved, spot_workers, worker
from rlboost_operator.config import OperatorSettings

WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet"})


def build_children(
    job: str,
    namespace: str,
    spec: JobSpec,
    settings: OperatorSettings,
    spot_replicas: int,
    finished: bool = False,
    spot_split: Mapping[str, int] | None = None,
    job_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every child of an RLJob but the token Secret, in creation order; `finished`: scaled to zero; `spot_split`:
    the spot ask per variant (spot.variant_split; without it, split with no bound of the nodes); `job_labels`: the
    RLJob's labels, on every child and pod template (job_labels.py)."""
    split = spot_split if spot_split is not None else spec.rollout.spot.per_variant(spot_replicas)
    objs = [
        config_map(job, namespace, spec),
        *service_accounts(job, namespace, spec, settings.service_account_annotations),
        *disruption_budgets(job, namespace),
        *([network_policy(job, namespace, settings)] if settings.network_policy else []),
        *nats(job, namespace, spec, settings),
        *weight_server(job, namespace, spec, settings),
        *manager(job, namespace, spec, settings),
        *trainer(job, namespace, spec, settings),
        worker(
            job,
            namespace,
            "reserved",
            spec.rollout.reserved,
            initial_reserved(spec),
            settings,
            colocated=spec.trainer.colocate_reserved,
            model=spec.model,
        ),
        *spot_workers(job, namespace, spec, settings, spot_replicas, split),
        *env_runners(job, namespace, spec, settings),  # agentic episodes (task.environment) only
    ]
    objs = services_first(objs)
    apply_policies(objs, job, spec, settings)  # each component's pod policy (issue 29), before the hash sees it
    annotate_config_hash(objs, spec)
    _apply_retention(objs, spec)
    with_job_labels(objs, job_labels or {})
    return scaled_to_zero(objs) if finished else objs


def services_first(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`objs` with every workload after everything else (Helm's install order): a pod then starts with its
    peers' Services in place, so the service links Kubernetes injects at pod creation are there, and anything
    that resolves names as the pod starts (kube-dns caches, the test lane's podlet) sees every Service."""
    return sorted(objs, key=lambda obj: obj["kind"] in WORKLOAD_KINDS)  # stable: each group keeps its order


def _apply_retention(objs: list[dict[str, Any]], spec: JobSpec) -> None:
    """spec.retention.pvcs 'Retain': the PVCs the operator creates get no owner (an empty list, so that a patch also
    drops an earlier owner), and outlive the RLJob; the trainer's follow its StatefulSet's retention policy."""
    if spec.retention.pvcs == "Retain":
        for obj in objs:
            if obj["kind"] == "PersistentVolumeClaim":
                obj["metadata"]["ownerReferences"] = []


def adopted(obj: dict[str, Any]) -> bool:
    """Whether the RLJob owns this child (deleted with it); False for a retained PVC."""
    return obj["metadata"].get("ownerReferences") != []


def scaled_to_zero(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children of a finished job: every Deployment and the StatefulSet at zero replicas, the rest as is."""
    for obj in objs:
        if obj["kind"] in WORKLOAD_KINDS:
            obj["spec"]["replicas"] = 0
    return objs
