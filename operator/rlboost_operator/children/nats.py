"""The job's own NATS: a nats-server Deployment (JetStream on an emptyDir) and its Service, configured by the
`<job>-nats-config` Secret (made once, like the credentials): TLS with the job CA, one user per role with rights
on that job's subjects only (rlboost.auth.nats_config)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlboost.auth.credentials import CA_CERT
from rlboost.auth.nats_config import NatsTls, render_nats_config
from rlboost.spec import JobSpec
from rlboost_operator.children.naming import (
    CREDENTIALS_DIR,
    NATS_CONFIG_DIR,
    NATS_MONITOR_PORT,
    NATS_PORT,
    labels,
    names,
    selector,
)
from rlboost_operator.children.pod import credentials_volume, deployment, pod_spec, probe, resources, security, service
from rlboost_operator.children.secrets import secret
from rlboost_operator.config import OperatorSettings


def nats_config_secret(job: str, namespace: str, credentials: Mapping[str, bytes]) -> dict[str, Any]:
    """The job's nats-server configuration (rlboost.auth.nats_config), with TLS from its credentials' items."""
    passwords = {
        key.removeprefix("nats-").removesuffix(".pass"): value.decode()
        for key, value in credentials.items()
        if key.startswith("nats-") and key.endswith(".pass")
    }
    tls = NatsTls(f"{CREDENTIALS_DIR}/tls-nats.crt", f"{CREDENTIALS_DIR}/tls-nats.key", f"{CREDENTIALS_DIR}/{CA_CERT}")
    text = render_nats_config(
        passwords,
        namespace,
        job,
        listen=f"0.0.0.0:{NATS_PORT}",
        store_dir="/data",
        tls=tls,
        monitor_port=NATS_MONITOR_PORT,
    )
    return secret(names(job)["nats_config"], namespace, labels(job, "nats"), {"nats.conf": text.encode()})


def nats(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The job's own NATS (JetStream on an emptyDir) and its Service; clients need the job's users and TLS."""
    n, lbl, sel = names(job)["nats"], labels(job, "nats"), selector(job, "nats")
    container = {
        "name": "nats",
        "image": settings.nats_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["nats-server", "-c", f"{NATS_CONFIG_DIR}/nats.conf"],
        "ports": [
            {"name": "client", "containerPort": NATS_PORT},
            {"name": "monitor", "containerPort": NATS_MONITOR_PORT},
        ],
        "readinessProbe": probe("monitor"),
        "livenessProbe": probe("monitor"),
        "resources": resources(0, spec.services.nats),
        "securityContext": security(),
        "volumeMounts": [
            {"name": "nats-config", "mountPath": NATS_CONFIG_DIR, "readOnly": True},
            {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
            {"name": "data", "mountPath": "/data"},
        ],
    }
    volumes = [
        {"name": "nats-config", "secret": {"secretName": names(job)["nats_config"], "defaultMode": 0o440}},
        credentials_volume(job, "nats"),
        {"name": "data", "emptyDir": {}},
    ]
    dep = deployment(n, namespace, lbl, sel, 1, pod_spec([container], volumes))
    return [dep, service(n, namespace, lbl, sel, {"client": NATS_PORT})]
