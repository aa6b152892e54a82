"""The pieces every job pod is made of: metadata, env entries, the locked-down security context, the job file,
credentials and scratch volumes, requests, probes, the pod spec (off spot nodes unless told otherwise), and the
Deployment, Service and PVC shapes around them. Each builder of a child kind composes these."""

from __future__ import annotations

from typing import Any

from rlboost.auth.credentials import ROLE_ITEMS
from rlboost.spec import ResourcesSpec
from rlboost.wire.service_routes import HEALTHZ
from rlboost_operator import spot
from rlboost_operator.children.naming import CONFIG_PATH, CREDENTIALS_DIR, SCRATCH_DIR, names
from rlboost_operator.config import OperatorSettings


def meta(name: str, namespace: str, lbl: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": lbl}


def env_var(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def scratch_env() -> list[dict[str, str]]:
    """The root filesystem is read-only: $HOME (and with it every cache under ~/.cache) lives in the emptyDir."""
    return [env_var("HOME", SCRATCH_DIR), env_var("XDG_CACHE_HOME", f"{SCRATCH_DIR}/.cache")]


def security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def credentials_volume(job: str, role: str) -> dict[str, Any]:
    """The job's credentials Secret with only the items `role` needs (rlboost.auth.credentials.ROLE_ITEMS)."""
    items = [{"key": key, "path": key} for key in ROLE_ITEMS[role]]
    secret = {"secretName": names(job)["credentials"], "items": items, "defaultMode": 0o440}
    return {"name": "credentials", "secret": secret}


def job_volumes(job: str, role: str) -> list[dict[str, Any]]:
    """The job file, `role`'s credentials and the scratch emptyDir: what every rlboost service pod mounts."""
    return [
        {"name": "config", "configMap": {"name": names(job)["config"]}},
        credentials_volume(job, role),
        {"name": "scratch", "emptyDir": {}},
    ]


def job_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "config", "mountPath": CONFIG_PATH, "subPath": "job.yaml", "readOnly": True},
        {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]


def resources(gpus: int, requests: ResourcesSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": {"cpu": requests.cpu, "memory": requests.memory}}
    if gpus:
        out["limits"] = {"nvidia.com/gpu": str(gpus)}
    return out


def probe(port: int | str, path: str = HEALTHZ, scheme: str = "HTTP") -> dict[str, Any]:
    get = {"path": path, "port": port} | ({"scheme": scheme} if scheme != "HTTP" else {})
    return {"httpGet": get, "periodSeconds": 10, "failureThreshold": 6}


STARTUP_PERIODS = 90  # 15 min of 10 s probe periods for a container's first answer


def startup_probe(port: int | str) -> dict[str, Any]:
    """A container that loads a model before it answers (the trainer's DeepSpeed start, a worker's engine) may take
    minutes, longer on a loaded node: liveness starts only after its first answer here, so it is not killed while
    starting (the cluster lane saw a trainer killed after 60 s of DeepSpeed start-up)."""
    return {**probe(port), "failureThreshold": STARTUP_PERIODS}


def pod_spec(
    containers: list[dict[str, Any]], volumes: list[dict[str, Any]], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
        "automountServiceAccountToken": False,  # no job pod talks to the Kubernetes API
        "containers": containers,
        "volumes": volumes,
    }
    spec.update(extra or {})
    spec.setdefault("affinity", spot.off_spot_affinity())  # only spot workers go where preemptions happen
    return spec


def deployment(
    name: str,
    namespace: str,
    lbl: dict[str, str],
    sel: dict[str, str],
    replicas: int,
    pod: dict[str, Any],
    recreate: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": sel},
        "template": {"metadata": {"labels": lbl}, "spec": pod},
    }
    if recreate:
        spec["strategy"] = {"type": "Recreate"}  # a ReadWriteOnce volume cannot be shared by two pods
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name, namespace, lbl), "spec": spec}


def service(
    name: str, namespace: str, lbl: dict[str, str], sel: dict[str, str], ports: dict[str, int], headless: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": sel,
        "ports": [
            {"name": pname, "port": port, "targetPort": port, "protocol": "TCP"} for pname, port in ports.items()
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True  # ranks must find rank 0 before any is Ready
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta(name, namespace, lbl), "spec": spec}


def claim_spec(storage: str, settings: OperatorSettings) -> dict[str, Any]:
    """A ReadWriteOnce volume claim of `storage`, in the operator's StorageClass (else the cluster's default)."""
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": storage}}}
    if settings.storage_class:
        spec["storageClassName"] = settings.storage_class
    return spec
