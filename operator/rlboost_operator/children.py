"""Pure builders of an RLJob's children: plain Kubernetes manifests (dicts), no API calls.

`build_children(job, namespace, spec, settings, spot_replicas)` returns every child except the Secrets made once
and never rewritten: the job's credentials (`credentials_secret`, items of
rlboost.auth.credentials; each role's pods mount only its ROLE_ITEMS at /etc/rlboost/credentials) and its NATS
configuration (`nats_config_secret`). Each job has its own NATS (a Deployment and Service, TLS with the job CA,
one user per role with rights on that job's subjects only) and, unless the operator's settings say otherwise, a
NetworkPolicy letting only the job's own pods in (the operator to NATS, the monitoring namespace to metrics).
Job pods run with a read-only root filesystem (an emptyDir at /tmp, which is $HOME, for what they write), no
service-account token, and CPU and memory requests from the spec. Each container's command is rendered
from its service's options model in `rlboost.options`, for a `Site` whose sockets bind 0.0.0.0 (probes and
Prometheus reach the pod's IP); the job spec travels in a ConfigMap mounted at /etc/rlboost/job.yaml, every
token in the credentials Secret.

The model (spec.model): the trainer and the reserved workers get it before they start, from an init container
`fetch-model` that runs `python -m rlboost.models.fetch` into an emptyDir mounted at /models (the model at
/models/policy); a 'pvc' model is the claim itself, mounted read-only at /models/policy, and the init container
only checks it. A failing fetch writes one line naming spec.model's field to its termination message, which the
operator copies into the RLJob's status. Spot workers get no model: they pull config, tokenizer and weights from
the weight-server (a new spot VM never touches the model store).

A worker's identity (issue 14): each pool's pods run as the job's ServiceAccount of that pool (`<job>-reserved-worker`,
`<job>-spot-worker`; no API token mounted) and get a projected service-account token for the audience
`rlboost/<namespace>/<job>` (rlboost.auth.worker_identity.audience) at IDENTITY_TOKEN, which the worker presents at
each registration (`--identity-token-file`; the kubelet rotates it). The manager checks it against the cluster's
keys, which the operator keeps in the credentials item `worker-identity.json` (worker_identity.py here).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlboost.auth.credentials import CA_CERT, ROLE_ITEMS, nats_password_file
from rlboost.auth.nats_config import NatsTls, render_nats_config
from rlboost.auth.worker_identity import audience
from rlboost.options import (
    ANY_ADDRESS,
    Site,
    manager_options,
    trainer_options,
    weight_server_options,
    worker_options,
)
from rlboost.spec import JobSpec, ModelSpec, PoolSpec, ResourcesSpec, SpotVariantSpec, dump_job_spec
from rlboost_operator import spot, spot_ask
from rlboost_operator.config import OperatorSettings

MANAGER_PORT, WEIGHTS_PORT, METRICS_PORT, RENDEZVOUS_PORT = 50051, 8000, 9090, 29500
PEER_PORT = 8700  # a worker serves the weights it holds to the job's other workers (peer fan-out)
CONFIG_PATH = "/etc/rlboost/job.yaml"
CHECKPOINT_DIR = "/data/checkpoints"  # on the trainer rank's PVC: a restarted trainer resumes from it
CONFIG_HASH = "rlboost.io/config-hash"  # pod template annotation: what the pods run; a change rolls them
# Spec fields only the operator reads: an edit of them must not roll the pods (it would cost the trainer the
# steps since its last checkpoint for nothing).
OPERATOR_ONLY_FIELDS = ("prices", "retention", "trainer.backoffLimit")
MODEL_ROOT, MODEL_DIR = "/models", "/models/policy"  # the model volume's mount, and the model directory in it
WORKER_STARTUP_TIMEOUT_S = 1800.0  # a worker waits this long for the trainer's first weight version
FETCH_CONTAINER = "fetch-model"  # the init container that makes the model ready (handlers watch it)
TERMINATION_LOG = "/dev/termination-log"
CREDENTIALS_DIR = "/etc/rlboost/credentials"  # each role's items of the job's credentials Secret
NATS_PORT, NATS_MONITOR_PORT, NATS_CONFIG_DIR = 4222, 8222, "/etc/nats"
SCRATCH_DIR = "/tmp"  # the one writable path of a read-only root filesystem (an emptyDir), also $HOME
IDENTITY_DIR = "/var/run/secrets/rlboost/identity"  # a worker's projected service-account token (its identity)
IDENTITY_TOKEN = f"{IDENTITY_DIR}/token"
IDENTITY_TOKEN_LIFETIME_S = 3600  # the kubelet renews the token at 80% of this; the worker re-reads it each Register
WORKER_POOLS = ("reserved", "spot")
OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rlboost", "app.kubernetes.io/component": "operator"}
VARIANT_LABEL, ACCELERATOR_LABEL = spot_ask.VARIANT_LABEL, "rlboost.io/accelerator"  # a spot variant's pods

IMAGES = {
    "manager": "rollout-manager",
    "weights": "weight-server",
    "trainer": "trainer",
    "torch": "rollout-worker",
    "sglang": "rollout-worker-sglang",
}


def names(job: str) -> dict[str, str]:
    """Names of a job's children."""
    return {
        "config": f"{job}-config",
        "credentials": f"{job}-credentials",
        "nats": f"{job}-nats",
        "nats_config": f"{job}-nats-config",
        "network_policy": f"{job}-pods",
        "trainer": f"{job}-trainer",
        "manager": f"{job}-manager",
        "weights": f"{job}-weights",
        "reserved": f"{job}-workers-reserved",
        "spot": f"{job}-workers-spot",
        "reserved_account": f"{job}-reserved-worker",
        "spot_account": f"{job}-spot-worker",
    }


def worker_service_accounts(job: str) -> dict[str, str]:
    """The job's worker ServiceAccounts -> the pool whose pods run as each (ClusterIdentity.service_accounts)."""
    n = names(job)
    return {n[f"{pool}_account"]: pool for pool in WORKER_POOLS}


def service_account(job: str, namespace: str, pool: str) -> dict[str, Any]:
    """The ServiceAccount a pool's worker pods run as: what their projected token names, so what the manager binds
    the pool to. It holds no API rights (no Role names it) and mounts no API token."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(names(job)[f"{pool}_account"], namespace, labels(job, "rollout-worker", pool)),
        "automountServiceAccountToken": False,
    }


def identity_volume(job: str, namespace: str) -> dict[str, Any]:
    """A projected service-account token for the job's audience only: good for proving the pod to the job's manager,
    for nothing else (the API server refuses a token of another audience)."""
    token = {"audience": audience(namespace, job), "expirationSeconds": IDENTITY_TOKEN_LIFETIME_S, "path": "token"}
    return {"name": "identity", "projected": {"sources": [{"serviceAccountToken": token}], "defaultMode": 0o440}}


def spot_variant_name(job: str, variant: str) -> str:
    """The Deployment of one spot variant (rollout.spot.variants)."""
    return f"{names(job)['spot']}-{variant}"


def spot_deployments(job: str, spec: JobSpec) -> list[str]:
    """The job's spot Deployments: one per variant, or the pool's single one."""
    variants = spec.rollout.spot.variants
    return [spot_variant_name(job, v.name) for v in variants] if variants else [names(job)["spot"]]


def _variant_labels(variant: SpotVariantSpec) -> dict[str, str]:
    """What tells a spot variant's pods apart (its Deployment's selector too): the name, and the accelerator."""
    out = {VARIANT_LABEL: variant.name}
    if variant.accelerator:
        out[ACCELERATOR_LABEL] = variant.accelerator
    return out


def labels(job: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "rlboost",
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "rlboost",
        "app.kubernetes.io/managed-by": "rlboost-operator",
        "rlboost.io/job": job,
    }
    if pool:
        out["rlboost.io/pool"] = pool
    return out


def selector(job: str, component: str, pool: str | None = None) -> dict[str, str]:
    out = {"rlboost.io/job": job, "app.kubernetes.io/component": component}
    if pool:
        out["rlboost.io/pool"] = pool
    return out


def image(settings: OperatorSettings, key: str) -> str:
    return f"{settings.image_registry}/{IMAGES[key]}:{settings.image_tag}"


def _meta(name: str, namespace: str, lbl: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": lbl}


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def site(job: str, namespace: str, settings: OperatorSettings) -> Site:
    """What every container is told: the mounted job file, NATS, the others' Service addresses; binding 0.0.0.0."""
    n = names(job)
    return Site(
        config=CONFIG_PATH,
        nats_url=nats_url(job, namespace),
        namespace=namespace,
        job=job,
        bind_host=ANY_ADDRESS,
        manager_address=f"{n['manager']}.{namespace}.svc:{MANAGER_PORT}",
        # https: the weight-server serves TLS with the job CA's certificate for this name (tls_hosts)
        weight_server_url=f"https://{n['weights']}.{namespace}.svc:{WEIGHTS_PORT}",
        credentials_dir=CREDENTIALS_DIR,
    )


def nats_host(job: str, namespace: str) -> str:
    """The DNS name of the job's NATS Service (its TLS certificate names it)."""
    return f"{names(job)['nats']}.{namespace}.svc"


def nats_url(job: str, namespace: str) -> str:
    return f"nats://{nats_host(job, namespace)}:{NATS_PORT}"


def tls_hosts(job: str, namespace: str) -> dict[str, list[str]]:
    """Every name a TLS service of the job is dialled at, for its certificate."""
    n = names(job)
    services = {"manager": n["manager"], "weight-server": n["weights"], "nats": n["nats"]}
    return {
        tls: [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]
        for tls, name in services.items()
    }


def _security() -> dict[str, Any]:
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


def _volumes(job: str, role: str) -> list[dict[str, Any]]:
    return [
        {"name": "config", "configMap": {"name": names(job)["config"]}},
        credentials_volume(job, role),
        {"name": "scratch", "emptyDir": {}},
    ]


def _mounts() -> list[dict[str, Any]]:
    return [
        {"name": "config", "mountPath": CONFIG_PATH, "subPath": "job.yaml", "readOnly": True},
        {"name": "credentials", "mountPath": CREDENTIALS_DIR, "readOnly": True},
        {"name": "scratch", "mountPath": SCRATCH_DIR},
    ]


def _topology_env() -> list[dict[str, Any]]:
    """Where a worker runs, for peer fan-out: the address peers reach it at and its zone and region. The node's
    topology labels reach a pod's own labels through the PodTopologyLabelsAdmission plugin (Kubernetes >= 1.33);
    without it they are empty, and the worker is simply one of the region '' (it only costs bandwidth)."""
    return [
        _field_env("RLBOOST_PEER_ADVERTISE", "status.podIP"),
        _field_env("RLBOOST_ZONE", "metadata.labels['topology.kubernetes.io/zone']"),
        _field_env("RLBOOST_REGION", "metadata.labels['topology.kubernetes.io/region']"),
    ]


def _scratch_env() -> list[dict[str, str]]:
    """The root filesystem is read-only: $HOME (and with it every cache under ~/.cache) lives in the emptyDir."""
    return [_env("HOME", SCRATCH_DIR), _env("XDG_CACHE_HOME", f"{SCRATCH_DIR}/.cache")]


def model_dir(model: ModelSpec) -> str:
    """Where the trainer's and reserved workers' model directory is in their pods."""
    return f"{MODEL_DIR}/{model.path.strip('/')}" if model.source == "pvc" and model.path.strip("/") else MODEL_DIR


def _model_volume(model: ModelSpec) -> dict[str, Any]:
    if model.source == "pvc":
        return {"name": "model", "persistentVolumeClaim": {"claimName": model.claim_name, "readOnly": True}}
    return {"name": "model", "emptyDir": {}}


def _model_mount(model: ModelSpec) -> dict[str, Any]:
    if model.source == "pvc":
        return {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
    return {"name": "model", "mountPath": MODEL_ROOT}  # the fetcher renames /models/policy into place inside it


def fetch_model_container(
    model: ModelSpec, settings: OperatorSettings, image_key: str, resources: ResourcesSpec
) -> dict[str, Any]:
    """The init container that fetches (or, for 'pvc', checks) the model before the pod's service starts; in the
    service's own image, which holds rlboost.models. Its error line becomes its termination message."""
    env = [_env("RLBOOST_CACHE_DIR", "off"), _env("HF_HUB_DISABLE_TELEMETRY", "1"), *_scratch_env()]
    if model.source == "huggingface" and model.token_secret:
        ref = {"name": model.token_secret, "key": "token"}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    command = [
        "python",
        "-m",
        "rlboost.models.fetch",
        "--config",
        CONFIG_PATH,
        "--dest",
        model_dir(model),
        "--termination-log",
        TERMINATION_LOG,
    ]
    return {
        "name": FETCH_CONTAINER,
        "image": image(settings, image_key),
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "env": env,
        "resources": _resources(0, resources),  # a download (or, for 'tiny', a CPU warm-up): no accelerator
        "securityContext": _security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*_mounts(), _model_mount(model)],
    }


def _resources(gpus: int, requests: ResourcesSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": {"cpu": requests.cpu, "memory": requests.memory}}
    if gpus:
        out["limits"] = {"nvidia.com/gpu": str(gpus)}
    return out


def _probe(port: int | str, path: str = "/healthz", scheme: str = "HTTP") -> dict[str, Any]:
    get = {"path": path, "port": port} | ({"scheme": scheme} if scheme != "HTTP" else {})
    return {"httpGet": get, "periodSeconds": 10, "failureThreshold": 6}


def _service(
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
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, namespace, lbl), "spec": spec}


def config_map(job: str, namespace: str, spec: JobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(names(job)["config"], namespace, labels(job, "config")),
        "data": {"job.yaml": dump_job_spec(spec)},
    }


def _secret(name: str, namespace: str, lbl: dict[str, str], items: Mapping[str, bytes]) -> dict[str, Any]:
    data = {key: base64.b64encode(value).decode() for key, value in items.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(name, namespace, lbl),
        "data": data,
    }


def credentials_secret(job: str, namespace: str, items: Mapping[str, bytes]) -> dict[str, Any]:
    """The job's credentials (rlboost.auth.credentials.generate_items with tls_hosts(job, namespace))."""
    return _secret(names(job)["credentials"], namespace, labels(job, "credentials"), items)


def secret_items(secret: dict[str, Any]) -> dict[str, bytes]:
    """A Secret's items, decoded."""
    return {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}


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
    return _secret(names(job)["nats_config"], namespace, labels(job, "nats"), {"nats.conf": text.encode()})


def operator_nats_password(credentials: Mapping[str, bytes]) -> str:
    return credentials[nats_password_file("operator")].decode()


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
        "readinessProbe": _probe("monitor"),
        "livenessProbe": _probe("monitor"),
        "resources": _resources(0, spec.services.nats),
        "securityContext": _security(),
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
    dep = _deployment(n, namespace, lbl, sel, 1, _pod_spec([container], volumes))
    return [dep, _service(n, namespace, lbl, sel, {"client": NATS_PORT})]


def network_policy(job: str, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """Only the job's own pods reach its pods; the operator reaches its NATS; the metrics namespaces scrape."""
    own = {"rlboost.io/job": job}
    operator_ns = (
        {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}}
        if settings.operator_namespace
        else {}
    )
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": own}}]},
        {
            "from": [{"namespaceSelector": operator_ns, "podSelector": {"matchLabels": OPERATOR_POD_LABELS}}],
            "ports": [{"port": NATS_PORT, "protocol": "TCP"}],
        },
    ]
    if settings.metrics_namespace_labels:
        # the weight-server serves /metrics on its API port (reads there need the job's tokens)
        ports = [{"port": port, "protocol": "TCP"} for port in (METRICS_PORT, WEIGHTS_PORT)]
        ingress.append(
            {"from": [{"namespaceSelector": {"matchLabels": settings.metrics_namespace_labels}}], "ports": ports}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(names(job)["network_policy"], namespace, labels(job, "network-policy")),
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _pod_spec(
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


def _deployment(
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
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(name, namespace, lbl), "spec": spec}


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
        "readinessProbe": _probe("metrics"),
        "livenessProbe": _probe("metrics"),
        "env": _scratch_env(),
        "resources": _resources(0, spec.services.manager),
        "securityContext": _security(),
        "volumeMounts": _mounts(),
    }
    pod = _pod_spec([container], _volumes(job, "manager"))
    dep = _deployment(n, namespace, lbl, sel, 1, pod)
    return [dep, _service(n, namespace, lbl, sel, {"grpc": MANAGER_PORT, "metrics": METRICS_PORT})]


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
        "readinessProbe": _probe("http", scheme="HTTPS"),
        "livenessProbe": _probe("http", scheme="HTTPS"),
        "env": _scratch_env(),
        "resources": _resources(0, spec.services.weight_server),
        "securityContext": _security(),
        "volumeMounts": [*_mounts(), {"name": "data", "mountPath": "/data"}],
    }
    volumes = [*_volumes(job, "weight-server"), {"name": "data", "persistentVolumeClaim": {"claimName": n}}]
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.weights_storage}},
    }
    if settings.storage_class:
        pvc_spec["storageClassName"] = settings.storage_class
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(n, namespace, lbl), "spec": pvc_spec}
    dep = _deployment(n, namespace, lbl, sel, 1, _pod_spec([container], volumes), recreate=True)
    return [pvc, dep, _service(n, namespace, lbl, sel, {"http": WEIGHTS_PORT})]


def trainer(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The trainer StatefulSet (one pod per rank) and its headless Service for rendezvous."""
    n, lbl, sel = names(job)["trainer"], labels(job, "trainer"), selector(job, "trainer")
    # Always --resume from the rank's PVC: a restarted trainer continues from its newest checkpoint, and one
    # whose job finished (a checkpoint at the last step) trains no step and re-publishes `done`.
    where = site(job, namespace, settings)
    checkpoints = Path(CHECKPOINT_DIR)
    cmd = trainer_options(
        where, model_dir(spec.model), "/data/run", METRICS_PORT, checkpoint_dir=checkpoints, resume=True
    ).command()
    env = [
        # The rank is the pod's ordinal (label set by the StatefulSet controller, Kubernetes >= 1.28).
        _field_env("RANK", "metadata.labels['apps.kubernetes.io/pod-index']"),
        _env("WORLD_SIZE", str(spec.trainer.ranks)),
        _env("MASTER_ADDR", f"{n}-0.{n}.{namespace}.svc"),
        _env("MASTER_PORT", str(RENDEZVOUS_PORT)),
        _env("LOCAL_RANK", "0"),
        *_scratch_env(),
    ]
    container = {
        "name": "trainer",
        "image": image(settings, "trainer"),
        "imagePullPolicy": settings.image_pull_policy,
        "command": cmd,
        "env": env,
        "ports": [
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        "livenessProbe": _probe("metrics"),
        "resources": _resources(spec.trainer.gpus_per_rank, spec.trainer.resources),
        "securityContext": _security(),
        "volumeMounts": [*_mounts(), {"name": "data", "mountPath": "/data"}, _model_mount(spec.model)],
    }
    pvc_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.trainer_storage}},
    }
    if settings.storage_class:
        pvc_spec["storageClassName"] = settings.storage_class
    fetch = fetch_model_container(spec.model, settings, "trainer", spec.trainer.resources)
    extra: dict[str, Any] = {"initContainers": [fetch]}
    if spec.trainer.gpus_per_rank:
        extra["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(n, namespace, lbl),
        "spec": {
            "serviceName": n,
            "replicas": spec.trainer.ranks,
            "podManagementPolicy": "Parallel",  # all ranks must start together to rendezvous
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": lbl},
                "spec": _pod_spec([container], [*_volumes(job, "trainer"), _model_volume(spec.model)], extra),
            },
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": pvc_spec}],
            # Checkpoints survive scaling to zero always, the RLJob's deletion per spec.retention.pvcs.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": spec.retention.pvcs, "whenScaled": "Retain"},
        },
    }
    return [
        _service(n, namespace, lbl, sel, {"rendezvous": RENDEZVOUS_PORT, "metrics": METRICS_PORT}, headless=True),
        sts,
    ]


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
    where = site(job, namespace, settings)
    local = model if pool_name == "reserved" else None
    options = worker_options(
        where,
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
    cmd = options.model_copy(update=update).command()
    container = {
        "name": "rollout-worker",
        "image": image(settings, pool.engine),
        "imagePullPolicy": settings.image_pull_policy,
        "command": cmd,
        "env": [
            _field_env("POD_NAME", "metadata.name"),
            _field_env("NODE_NAME", "spec.nodeName"),
            *_topology_env(),
            *_scratch_env(),
        ],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}, {"name": "peers", "containerPort": PEER_PORT}],
        "readinessProbe": _probe("metrics"),
        "livenessProbe": _probe("metrics"),
        "resources": _resources(pool.gpus_per_worker, pool.resources),
        "securityContext": _security(),
        "volumeMounts": [
            *_mounts(),
            {"name": "identity", "mountPath": IDENTITY_DIR, "readOnly": True},
            *([_model_mount(local)] if local else []),
        ],
    }
    if pool_name == "spot":
        sched = spot.spot_scheduling(pool)
    elif colocated:
        sched = spot.colocated_scheduling(pool, selector(job, "trainer"), sel)
    else:
        sched = spot.reserved_scheduling(pool)
    # Spot pods get the notice window (up to 120 s on GKE) to drain; the manager migrates their tokens.
    extra = {
        **sched,
        "terminationGracePeriodSeconds": 25 if pool_name == "spot" else 60,
        "serviceAccountName": names(job)[f"{pool_name}_account"],  # its token names the pool (the manager checks)
    }
    volumes = [
        *_volumes(job, "worker"),
        identity_volume(job, namespace),
        *([_model_volume(local)] if local else []),
    ]
    if local:
        extra["initContainers"] = [fetch_model_container(local, settings, pool.engine, pool.resources)]
    return _deployment(n, namespace, lbl, sel, replicas, _pod_spec([container], volumes, extra))


def initial_reserved(spec: JobSpec) -> int:
    pool = spec.rollout.reserved
    return max(pool.min_replicas, min(pool.max_replicas, pool.replicas))


def workloads(job: str, variants: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(kind, name) of every child that runs pods: what scaling a job to zero patches; `variants`: the names of
    spot variants whose Deployments there may be."""
    n = names(job)
    deployments = ("nats", "manager", "weights", "reserved", "spot")
    variant_deployments = [("Deployment", spot_variant_name(job, v)) for v in variants]
    return [("StatefulSet", n["trainer"]), *(("Deployment", n[k]) for k in deployments), *variant_deployments]


def _service_view(spec: JobSpec) -> dict[str, Any]:
    """The job file as the services read it: without the fields only the operator reads."""
    data = spec.model_dump(by_alias=True, mode="json")
    for path in OPERATOR_ONLY_FIELDS:
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node.pop(leaf, None)
    return data


def config_hash(spec: JobSpec, pod: dict[str, Any]) -> str:
    """A digest of what a pod runs that its template does not show: the job file it mounts (less the operator's
    own fields) and its containers' rendered commands, args, env and images."""
    run = [
        {key: c.get(key) for key in ("name", "image", "command", "args", "env")}
        for c in [*pod.get("initContainers", []), *pod["containers"]]
    ]
    text = json.dumps({"job": _service_view(spec), "containers": run}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_nats(obj: dict[str, Any]) -> bool:
    """The job's NATS runs no job file and no rlboost command: no config hash (a spec edit must not restart it)."""
    return obj["metadata"]["labels"].get("app.kubernetes.io/component") == "nats"


def _annotate_config_hash(objs: list[dict[str, Any]], spec: JobSpec) -> None:
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet") and not _is_nats(obj):
            template = obj["spec"]["template"]
            annotations = template["metadata"].setdefault("annotations", {})
            annotations[CONFIG_HASH] = config_hash(spec, template["spec"])


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
        if obj["kind"] in ("Deployment", "StatefulSet"):
            obj["spec"]["replicas"] = 0
    return objs


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


def build_children(
    job: str,
    namespace: str,
    spec: JobSpec,
    settings: OperatorSettings,
    spot_replicas: int,
    finished: bool = False,
    spot_split: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Every child of an RLJob but the token Secret, in creation order; `finished`: scaled to zero; `spot_split`:
    the spot ask per variant (spot.variant_split; without it, split with no bound of the nodes)."""
    split = spot_split if spot_split is not None else spec.rollout.spot.per_variant(spot_replicas)
    objs = [
        config_map(job, namespace, spec),
        *(service_account(job, namespace, pool) for pool in WORKER_POOLS),
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
    ]
    objs = services_first(objs)
    _annotate_config_hash(objs, spec)
    _apply_retention(objs, spec)
    return scaled_to_zero(objs) if finished else objs


WORKLOAD_KINDS = frozenset({"Deployment", "StatefulSet"})


def services_first(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`objs` with every workload after everything else (Helm's install order): a pod then starts with its
    peers' Services in place, so the service links Kubernetes injects at pod creation are there, and anything
    that resolves names as the pod starts (kube-dns caches, the test lane's podlet) sees every Service."""
    return sorted(objs, key=lambda obj: obj["kind"] in WORKLOAD_KINDS)  # stable: each group keeps its order
