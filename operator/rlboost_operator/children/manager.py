"""The rollout-manager: its Deployment (one replica) and its Service (gRPC + metrics)."""

from __future__ import annotations

from typing import Any

from rlboost.options import manager_options
from rlboost.spec import JobSpec
from rlboost_operator.children.naming import MANAGER_PORT, METRICS_PORT, image, labels, names, selector, site
from rlboost_operator.children.pod import (
    deployment,
    job_mounts,
    job_volumes,
    pod_spec,
    probe,
    resources,
    scratch_env,
    security,
    service,
)
from rlboost_operator.config import OperatorSettings


def manager(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The rollout-manager Deployment and its Service (gRPC + metrics)."""
    n, lbl, sel = names(job)["manager"], labels(job, "rollout-manager"), selector(job, "rollout-manager")
    cmd = manager_options(site(job, namespace, settings), MANAGER_PORT, METRICS_PORT).command()
    container = {
        "name": "rollout-manager",
        "image": image(settings, "manager"),
        "imagePullPolicy": settings.image_pull_policy,
        "command": cmd,
        "ports": [{"name": "grpc", "containerPort": MANAGER_PORT}, {"name": "metrics", "containerPort": METRICS_PORT}],
        "readinessProbe": probe("metrics"),
        "livenessProbe": probe("metrics"),
        "env": scratch_env(),
        "resources": resources(0, spec.services.manager),
        "securityContext": security(),
        "volumeMounts": job_mounts(),
    }
    pod = pod_spec([container], job_volumes(job, "manager"))
    dep = deployment(n, namespace, lbl, sel, 1, pod)
    return [dep, service(n, namespace, lbl, sel, {"grpc": MANAGER_PORT, "metrics": METRICS_PORT})]
