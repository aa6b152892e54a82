"""The trainer: a StatefulSet (one pod per rank, a checkpoint PVC each, the model fetched by an init container)
and its headless Service, which the ranks rendezvous through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlboost.options import trainer_options
from rlboost.spec import JobSpec
from rlboost_operator.children.model import fetch_model_container, model_dir, model_mount, model_volume
from rlboost_operator.children.naming import (
    CHECKPOINT_DIR,
    METRICS_PORT,
    RENDEZVOUS_PORT,
    image,
    labels,
    names,
    selector,
    site,
)
from rlboost_operator.children.pod import (
    claim_spec,
    env_var,
    field_env,
    job_mounts,
    job_volumes,
    meta,
    pod_spec,
    probe,
    resources,
    scratch_env,
    security,
    service,
    startup_probe,
)
from rlboost_operator.config import OperatorSettings


def trainer(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The trainer StatefulSet (one pod per rank) and its headless Service for rendezvous."""
    n, lbl, sel = names(job)["trainer"], labels(job, "trainer"), selector(job, "trainer")
    container = _container(job, namespace, spec, settings)
    fetch = fetch_model_container(spec.model, settings, "trainer", spec.trainer.resources)
    extra: dict[str, Any] = {"initContainers": [fetch]}
    if spec.trainer.gpus_per_rank:
        extra["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(n, namespace, lbl),
        "spec": {
            "serviceName": n,
            "replicas": spec.trainer.ranks,
            "podManagementPolicy": "Parallel",  # all ranks must start together to rendezvous
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": lbl},
                "spec": pod_spec([container], [*job_volumes(job, "trainer"), model_volume(spec.model)], extra),
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "data"}, "spec": claim_spec(settings.trainer_storage, settings)}
            ],
            # Checkpoints survive scaling to zero always, the RLJob's deletion per spec.retention.pvcs.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": spec.retention.pvcs, "whenScaled": "Retain"},
        },
    }
    return [
        service(n, namespace, lbl, sel, {"rendezvous": RENDEZVOUS_PORT, "metrics": METRICS_PORT}, headless=True),
        sts,
    ]


def _container(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> dict[str, Any]:
    """A rank's trainer container: its command, its rank and rendezvous address, its checkpoint volume."""
    n = names(job)["trainer"]
    # Always --resume from the rank's PVC: a restarted trainer continues from its newest checkpoint, and one
    # whose job finished (a checkpoint at the last step) trains no step and re-publishes `done`.
    where = site(job, namespace, settings)
    checkpoints = Path(CHECKPOINT_DIR)
    cmd = trainer_options(
        where, model_dir(spec.model), "/data/run", METRICS_PORT, checkpoint_dir=checkpoints, resume=True
    ).command()
    env = [
        # The rank is the pod's ordinal (label set by the StatefulSet controller, Kubernetes >= 1.28).
        field_env("RANK", "metadata.labels['apps.kubernetes.io/pod-index']"),
        env_var("WORLD_SIZE", str(spec.trainer.ranks)),
        env_var("MASTER_ADDR", f"{n}-0.{n}.{namespace}.svc"),
        env_var("MASTER_PORT", str(RENDEZVOUS_PORT)),
        env_var("LOCAL_RANK", "0"),
        *scratch_env(),
    ]
    return {
        "name": "trainer",
        "image": image(settings, "trainer"),
        "imagePullPolicy": settings.image_pull_policy,
        "command": cmd,
        "env": env,
        "ports": [
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "startupProbe": startup_probe("metrics"),
        "livenessProbe": probe("metrics"),
        "resources": resources(spec.trainer.gpus_per_rank, spec.trainer.resources),
        "securityContext": security(),
        "volumeMounts": [*job_mounts(), {"name": "data", "mountPath": "/data"}, model_mount(spec.model)],
    }
