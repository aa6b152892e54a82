"""Rollout-worker Deployments: the reserved pool's (the model fetched by an init container; one per trainer node
when colocated) and the spot pool's (one per spot variant, or the pool's single one; no model: a spot pod pulls
config, tokenizer and weights from the weight-server). Each pool's pods run as that pool's ServiceAccount and prove
it with a projected token (service_accounts.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlboost.options import worker_options
from rlboost.spec import JobSpec, ModelSpec, PoolSpec, SpotVariantSpec
from rlboost_operator import spot
from rlboost_operator.children.model import fetch_model_container, model_dir, model_mount, model_volume
from rlboost_operator.children.naming import (
    ACCELERATOR_LABEL,
    IDENTITY_DIR,
    IDENTITY_TOKEN,
    METRICS_PORT,
    PEER_PORT,
    VARIANT_LABEL,
    image,
    labels,
    names,
    selector,
    site,
    spot_variant_name,
)
from rlboost_operator.children.pod import (
    deployment,
    field_env,
    job_mounts,
    job_volumes,
    pod_spec,
    probe,
    resources,
    scratch_env,
    security,
    startup_probe,
)
from rlboost_operator.children.service_accounts import identity_volume
from rlboost_operator.config import OperatorSettings

WORKER_STARTUP_TIMEOUT_S = 1800.0  # a worker waits this long for the trainer's first weight version


def _variant_labels(variant: SpotVariantSpec) -> dict[str, str]:
    """What tells a spot variant's pods apart (its Deployment's selector too): the name, and the accelerator."""
    out = {VARIANT_LABEL: variant.name}
    if variant.accelerator:
        out[ACCELERATOR_LABEL] = variant.accelerator
    return out


def _topology_env() -> list[dict[str, Any]]:
    """Where a worker runs, for peer fan-out: the address peers reach it at and its zone and region. The node's
    topology labels reach a pod's own labels through the PodTopologyLabelsAdmission plugin (Kubernetes >= 1.33);
    without it they are empty, and the worker is simply one of the region '' (it only costs bandwidth)."""
    return [
        field_env("RLBOOST_PEER_ADVERTISE", "status.podIP"),
        field_env("RLBOOST_ZONE", "metadata.labels['topology.kubernetes.io/zone']"),
        field_env("RLBOOST_REGION", "metadata.labels['topology.kubernetes.io/region']"),
    ]


def _command(
    job: str,
    namespace: str,
    pool_name: str,
    pool: PoolSpec,
    settings: OperatorSettings,
    local: ModelSpec | None,
    variant: SpotVariantSpec | None,
) -> list[str]:
    """The worker's command, from its options model (rlboost.options.worker_options)."""
    options = worker_options(
        site(job, namespace, settings),
        "$(POD_NAME)",
        pool_name,
        "$(NODE_NAME)",
        model_dir(local) if local else "",
        METRICS_PORT,
        accelerated=pool.gpus_per_worker > 0,
        peer_port=PEER_PORT,
        variant=variant.name if variant is not None else "",
    )
    # The first weight version comes only once the trainer's own init container has fetched the model (minutes
    # for a large one; 2 min for `tiny` on a loaded CPU node): a worker giving up after the local 120 s restarts.
    update = {"startup_timeout": WORKER_STARTUP_TIMEOUT_S, "identity_token_file": IDENTITY_TOKEN}
    return options.model_copy(update=update).command()


def _container(
    job: str,
    namespace: str,
    pool_name: str,
    pool: PoolSpec,
    settings: OperatorSettings,
    local: ModelSpec | None,
    variant: SpotVariantSpec | None,
) -> dict[str, Any]:
    """The rollout-worker container: its command, where it runs (pod, node, topology), its identity token and,
    for `local`, the model directory."""
    return {
        "name": "rollout-worker",
        "image": image(settings, pool.engine),
        "imagePullPolicy": settings.image_pull_policy,
        "command": _command(job, namespace, pool_name, pool, settings, local, variant),
        "env": [
            field_env("POD_NAME", "metadata.name"),
            field_env("NODE_NAME", "spec.nodeName"),
            *_topology_env(),
            *scratch_env(),
        ],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}, {"name": "peers", "containerPort": PEER_PORT}],
        "readinessProbe": probe("metrics"),
        "startupProbe": startup_probe("metrics"),
        "livenessProbe": probe("metrics"),
        "resources": resources(pool.gpus_per_worker, pool.resources),
        "securityContext": security(),
        "volumeMounts": [
            *job_mounts(),
            {"name": "identity", "mountPath": IDENTITY_DIR, "readOnly": True},
            *([model_mount(local)] if local else []),
        ],
    }


def _scheduling(job: str, pool_name: str, pool: PoolSpec, colocated: bool, sel: dict[str, str]) -> dict[str, Any]:
    """Spot pods on spot nodes only; reserved pods off them, next to a trainer rank each when colocated."""
    if pool_name == "spot":
        return spot.spot_scheduling(pool)
    if colocated:
        return spot.colocated_scheduling(pool, selector(job, "trainer"), sel)
    return spot.reserved_scheduling(pool)


def worker(
    job: str,
    namespace: str,
    pool_name: str,
    pool: PoolSpec,
    replicas: int,
    settings: OperatorSettings,
    colocated: bool = False,
    model: ModelSpec | None = None,
    variant: SpotVariantSpec | None = None,
) -> dict[str, Any]:
    """A rollout-worker Deployment for one pool ('reserved' or 'spot'); `colocated`: one per trainer rank's node.
    `model`: the reserved pool's pods fetch it in an init container; a spot pod (or any pool given none) gets no
    model directory and pulls config, tokenizer and weights from the weight-server. `variant`: one spot variant's
    Deployment (`pool` is then the variant's, SpotPoolSpec.variant_pool), named and labelled after it."""
    n, lbl, sel = (
        names(job)[pool_name],
        labels(job, "rollout-worker", pool_name),
        selector(job, "rollout-worker", pool_name),
    )
    if variant is not None:
        n = spot_variant_name(job, variant.name)
        lbl, sel = {**lbl, **_variant_labels(variant)}, {**sel, VARIANT_LABEL: variant.name}
    local = model if pool_name == "reserved" else None
    container = _container(job, namespace, pool_name, pool, settings, local, variant)
    # Spot pods get the notice window (up to 120 s on GKE) to drain; the manager migrates their tokens.
    extra = {
        **_scheduling(job, pool_name, pool, colocated, sel),
        "terminationGracePeriodSeconds": 25 if pool_name == "spot" else 60,
        "serviceAccountName": names(job)[f"{pool_name}_account"],  # its token names the pool (the manager checks)
    }
    volumes = [
        *job_volumes(job, "worker"),
        identity_volume(job, namespace),
        *([model_volume(local)] if local else []),
    ]
    if local:
        extra["initContainers"] = [fetch_model_container(local, settings, pool.engine, pool.resources)]
    return deployment(n, namespace, lbl, sel, replicas, pod_spec([container], volumes, extra))


def initial_reserved(spec: JobSpec) -> int:
    pool = spec.rollout.reserved
    return max(pool.min_replicas, min(pool.max_replicas, pool.replicas))


def spot_workers(
    job: str, namespace: str, spec: JobSpec, settings: OperatorSettings, replicas: int, split: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The spot Deployments: one per variant at its share of the ask (`split`), or the pool's one at `replicas`."""
    pool = spec.rollout.spot
    if not pool.variants:
        return [worker(job, namespace, "spot", pool, replicas, settings)]
    return [
        worker(job, namespace, "spot", pool.variant_pool(v.name), split.get(v.name, 0), settings, variant=v)
        for v in pool.variants
    ]
