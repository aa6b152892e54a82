"""The weight-server: its Deployment (one replica, recreated on a change: its volume is ReadWriteOnce), its
Service (HTTPS with the job CA's certificate) and the PVC that holds the published weight versions."""

from __future__ import annotations

from typing import Any

from rlboost.options import weight_server_options
from rlboost.spec import JobSpec
from rlboost_operator.children.naming import WEIGHTS_PORT, image, labels, names, selector, site
from rlboost_operator.children.pod import (
    claim_spec,
    deployment,
    job_mounts,
    job_volumes,
    meta,
    pod_spec,
    probe,
    resources,
    scratch_env,
    security,
    service,
)
from rlboost_operator.config import OperatorSettings


def weight_server(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The weight-server Deployment, its Service and its PVC."""
    n, lbl, sel = names(job)["weights"], labels(job, "weight-server"), selector(job, "weight-server")
    cmd = weight_server_options(site(job, namespace, settings), WEIGHTS_PORT, "/data").command()
    container = {
        "name": "weight-server",
        "image": image(settings, "weights"),
        "imagePullPolicy": settings.image_pull_policy,
        "command": cmd,
        "ports": [{"name": "http", "containerPort": WEIGHTS_PORT}],
        # its API port serves TLS (the kubelet does not verify a probe's certificate)
        "readinessProbe": probe("http", scheme="HTTPS"),
        "livenessProbe": probe("http", scheme="HTTPS"),
        "env": scratch_env(),
        "resources": resources(0, spec.services.weight_server),
        "securityContext": security(),
        "volumeMounts": [*job_mounts(), {"name": "data", "mountPath": "/data"}],
    }
    volumes = [*job_volumes(job, "weight-server"), {"name": "data", "persistentVolumeClaim": {"claimName": n}}]
    pvc_spec = claim_spec(settings.weights_storage, settings)
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(n, namespace, lbl), "spec": pvc_spec}
    dep = deployment(n, namespace, lbl, sel, 1, pod_spec([container], volumes), recreate=True)
    return [pvc, dep, service(n, namespace, lbl, sel, {"http": WEIGHTS_PORT})]
