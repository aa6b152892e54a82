"""The podlet: a stand-in for the kubelet and the workload controllers of one namespace, on podman.

    python scripts/cluster/podlet.py --api http://10.213.0.1:6443 --namespace default \
        --network rlboost-lane --subnet 10.213.0.0/24 --state-dir /tmp/lane --run-id abc \
        --node lane-reserved-0 --node 'lane-spot-0=cloud.google.com/gke-spot=true'

It polls the Kubernetes API (kmock, scripts/cluster/kube_api.py) once a second and does what the
controllers and a kubelet would do for the namespace's Deployments and StatefulSets:
- controllers: a Deployment's replicas become pods `<name>-<template hash>-<suffix>` (a changed template
  replaces its pods, Recreate-style); a StatefulSet's become `<name>-<ordinal>` (label
  `apps.kubernetes.io/pod-index`, PVCs from volumeClaimTemplates created once and kept, Parallel or
  OrderedReady start); `status.replicas/readyReplicas/...` are written back;
- admission: a pod naming a PriorityClass that does not exist is not created (FailedCreate, as the Priority plugin
  refuses it), else it gets the class's priority;
- scheduler: a pod goes to a Node (Node objects the podlet registers, all on this one machine, tainted with
  every --node-taint) whose labels
  satisfy its nodeSelector and required nodeAffinity and whose NoSchedule/NoExecute taints it tolerates;
  otherwise it stays Pending (Unschedulable);
- kubelet: each pod is one podman container from the local image (never pulled), with the pod's command,
  args (`$(VAR)` expanded), env (values, fieldRef, secretKeyRef, configMapKeyRef, envFrom, service links),
  ConfigMap/Secret volumes written as files (items, modes, fsGroup), emptyDir (per pod; medium Memory: a tmpfs of
  its sizeLimit, e.g. a larger /dev/shm) and PVC (a directory
  per claim, kept across pod restarts and replacements) volumes as host directories, subPath mounts,
  `projected` volumes of `serviceAccountToken` sources (a token of the pod's serviceAccountName, which must
  exist, for the source's audience, signed with --signing-key: sa_tokens.py, where the stand-in begins; a real
  kubelet gets it from the API server's TokenRequest API and renews it, the podlet writes a fresh one at each
  container start only),
  runAsUser/Group, fsGroup, dropped capabilities, no-new-privileges; an address on the lane's podman network
  with DNS aliases for every Service whose selector matches the pod (`svc`, `svc.ns`, `svc.ns.svc`,
  `svc.ns.svc.cluster.local`) and `<pod>.<serviceName>.<ns>.svc` for StatefulSet pods; startup, readiness
  and liveness probes (httpGet, tcpSocket, exec) run from the host as the kubelet runs them from the node;
  restartPolicy Always with the kubelet's back-off (10 s doubling to 5 min) and counted restarts; a failing
  liveness probe restarts the container; deletion (scale-down, a deleted Pod, a deleted Node) stops the
  container with SIGTERM and the pod's terminationGracePeriodSeconds, then SIGKILL;
- Pod objects in the API with phase, conditions, podIP, nodeName and containerStatuses (ready, started,
  restartCount, state, lastState), so the operator sees what it would on a cluster. Pods carry a finalizer
  of the podlet, so a `kubectl delete pod` shows the pod Terminating until its container has stopped.

Init containers run in order, each to exit 0 (retried with back-off), in the pod's address and volumes. Every
container gets a file at its terminationMessagePath; a failed init container's exit code and termination
message (that file, or its log's tail with FallbackToLogsOnError) show in initContainerStatuses' lastState.

Not emulated: ClusterIPs and kube-proxy (a Service name resolves to every matching pod, ready or not),
Services created after a pod started (its DNS aliases are fixed when its container starts; the operator creates
Services before workloads, and the podlet lists Services again just before each start),
pods of more than one container (refused, logged), resource limits and requests, image pulls, ConfigMap
and Secret updates after a pod started, hostPath volumes, other projected sources, token renewal, rolling-update
surge, pod
disruption budgets, garbage collection of owned objects, QoS and eviction under pressure, NetworkPolicy
(every lane container shares one podman network: a job's NetworkPolicy is stored by the API, not enforced),
automountServiceAccountToken (no pod gets a service-account token either way).

Outputs under --state-dir: `logs/<pod>.log` (every container run of the pod, appended as they end, then
the live one at exit), `endpoints.json` (each Service's pods with IP, readiness and ports) and `pods.json` (every
running pod with its labels and named ports; the lane turns it into Prometheus targets), `pvc/<claim>/` and `pods/<pod>/` (volumes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import string
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import sa_tokens

log = logging.getLogger("podlet")
FINALIZER = "lane.rlboost.io/podlet"
TERMINATION_PATH = "/dev/termination-log"  # terminationMessagePath's default
BACKOFF_START_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10.0, 300.0, 600.0
PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1, "failureThreshold": 3}
MERGE = {"Content-Type": "application/merge-patch+json"}
ENV_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- pure helpers: scheduling, env, names ---------------------------------------------------------


def parse_taint(text: str) -> dict[str, str]:
    """KEY=VALUE:EFFECT (kubectl taint's form) as a Node taint."""
    key_value, _, effect = text.rpartition(":")
    key, _, value = key_value.partition("=")
    return {"key": key, "value": value, "effect": effect}


QUANTITY_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity_bytes(text: str) -> int:
    """A Kubernetes memory quantity ('256Mi', '1G', '1048576') in bytes."""
    for unit, factor in QUANTITY_UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(float(text))


def memory_backed(volume: Mapping[str, Any]) -> bool:
    return (volume.get("emptyDir") or {}).get("medium") == "Memory"


def tmpfs_mount(path: str, size_limit: str | None) -> str:
    """podman's --mount for a memory-backed emptyDir (e.g. a larger /dev/shm); no sizeLimit: podman's default."""
    size = f",tmpfs-size={quantity_bytes(size_limit)}" if size_limit else ""
    return f"type=tmpfs,destination={path},tmpfs-mode=1777{size}"


def template_hash(template: Mapping[str, Any]) -> str:
    """A short stable hash of a pod template (the pod-template-hash / controller-revision-hash)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def labels_match(selector: Mapping[str, str] | None, labels: Mapping[str, str]) -> bool:
    """A Service-style selector: non-empty, and every key equal."""
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def _expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", "In"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            a, b = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol["key"] == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_fits(pod_spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether the scheduler may place the pod on the node: selector, required node affinity, taints."""
    labels = node.get("metadata", {}).get("labels") or {}
    if node.get("spec", {}).get("unschedulable") or node.get("metadata", {}).get("deletionTimestamp"):
        return False
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        (pod_spec.get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    if required and not any(
        all(_expression_holds(e, labels) for e in term.get("matchExpressions") or []) for term in required
    ):
        return False
    tolerations = pod_spec.get("tolerations") or []
    return all(
        _tolerates(tolerations, t)
        for t in node.get("spec", {}).get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known variables substituted, unknown left as written, `$$` -> `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return ENV_REF.sub(sub, text)


def field_ref(path: str, pod: Mapping[str, Any]) -> str:
    """The value of a downward-API fieldPath for a pod (metadata.name, metadata.labels['k'], status.podIP...)."""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((pod["metadata"].get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
        "status.podIPs": pod.get("status", {}).get("podIP", ""),
        "status.hostIP": pod.get("status", {}).get("hostIP", ""),
    }
    if path not in simple:
        raise ValueError(f"fieldRef.fieldPath {path!r} is not supported by the podlet")
    return str(simple[path])


def service_link_env(services: Iterable[Mapping[str, Any]], endpoints: Mapping[str, list[str]]) -> dict[str, str]:
    """The kubelet's service links (enableServiceLinks): <SVC>_SERVICE_HOST/_PORT... for non-headless Services.

    The lane has no ClusterIPs: the host is the first pod behind the Service when the container starts."""
    out: dict[str, str] = {}
    for svc in services:
        spec = svc.get("spec") or {}
        ips = endpoints.get(svc["metadata"]["name"]) or []
        if spec.get("clusterIP") == "None" or not ips or not spec.get("ports"):
            continue
        prefix = svc["metadata"]["name"].upper().replace("-", "_")
        ports = spec["ports"]
        out[f"{prefix}_SERVICE_HOST"], out[f"{prefix}_SERVICE_PORT"] = ips[0], str(ports[0]["port"])
        out[f"{prefix}_PORT"] = f"tcp://{ips[0]}:{ports[0]['port']}"
        for port in ports:
            proto = port.get("protocol", "TCP")
            key = f"{prefix}_PORT_{port['port']}_{proto}"
            out[key], out[f"{key}_PROTO"] = f"{proto.lower()}://{ips[0]}:{port['port']}", proto.lower()
            out[f"{key}_PORT"], out[f"{key}_ADDR"] = str(port["port"]), ips[0]
            if port.get("name"):
                out[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(port["port"])
    return out


def dns_aliases(pod: Mapping[str, Any], services: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names cluster DNS would give the pod: matching Services, and its own name under its subdomain."""
    ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}
    names: list[str] = []
    for svc in services:
        if labels_match((svc.get("spec") or {}).get("selector"), labels):
            name = svc["metadata"]["name"]
            names += [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]
    sub = pod["spec"].get("subdomain")
    if sub:
        host = pod["spec"].get("hostname") or pod["metadata"]["name"]
        names += [
            f"{host}.{sub}",
            f"{host}.{sub}.{ns}",
            f"{host}.{sub}.{ns}.svc",
            f"{host}.{sub}.{ns}.svc.cluster.local",
        ]
    return list(dict.fromkeys(names))


def container_port(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"port {port!r} is not a named port of container {container.get('name')!r}")


def projected_token_files(
    volume: Mapping[str, Any], pod: Mapping[str, Any], accounts: Iterable[Mapping[str, Any]], key: Any
) -> dict[str, bytes]:
    """The files of a `projected` volume of serviceAccountToken sources: path -> the token the kubelet would write
    (for the pod's serviceAccountName, which must exist; the source's audience and expirationSeconds)."""
    meta, spec = pod["metadata"], pod["spec"]
    name = spec.get("serviceAccountName") or "default"
    account = next((a for a in accounts if a["metadata"]["name"] == name), None)
    if account is None:
        raise ValueError(f"serviceaccount {name!r} not found (the pod's serviceAccountName)")
    out: dict[str, bytes] = {}
    for source in volume["projected"].get("sources") or []:
        token = source.get("serviceAccountToken")
        if token is None:
            raise ValueError(f"volume {volume['name']!r}: only serviceAccountToken projected sources are emulated")
        lifetime = int(token.get("expirationSeconds", 3600))
        if lifetime < 600:
            raise ValueError(f"volume {volume['name']!r}: expirationSeconds must be at least 600, as the API says")
        pod_ref = (meta["name"], meta.get("uid", ""))
        account_ref = (name, account["metadata"].get("uid", ""))
        audience = token.get("audience") or sa_tokens.ISSUER  # the kubelet's default: the API server's audience
        signed = sa_tokens.pod_token(key, audience, meta["namespace"], pod_ref, account_ref, lifetime)
        out[token["path"]] = signed.encode()
    return out


def random_suffix(n: int = 5) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(alphabet[b % len(alphabet)] for b in os.urandom(n))


# --- the API ---------------------------------------------------------------------------------------


class Api:
    """The few Kubernetes API calls the podlet makes, over httpx."""

    PATHS = {
        "Pod": "/api/v1/namespaces/{ns}/pods",
        "Service": "/api/v1/namespaces/{ns}/services",
        "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
        "Secret": "/api/v1/namespaces/{ns}/secrets",
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
        "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
        "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
        "Node": "/api/v1/nodes",
        "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
    }

    def __init__(self, url: str, namespace: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=10)
        self.namespace = namespace

    def path(self, kind: str, name: str | None = None) -> str:
        base = self.PATHS[kind].format(ns=self.namespace)
        return f"{base}/{name}" if name else base

    async def list(self, kind: str) -> list[dict[str, Any]]:
        resp = await self.http.get(self.path(kind))
        if resp.status_code == 404:
            return []
        return resp.raise_for_status().json().get("items") or []

    async def create(self, kind: str, obj: dict[str, Any]) -> None:
        resp = await self.http.post(self.path(kind), json=obj)
        if resp.status_code != 409:
            resp.raise_for_status()

    async def patch(self, kind: str, name: str, body: dict[str, Any]) -> bool:
        resp = await self.http.patch(self.path(kind, name), json=body, headers=MERGE)
        if resp.status_code == 404:
            return False
        resp.raise_for_status()
        return True

    async def delete(self, kind: str, name: str) -> None:
        resp = await self.http.delete(self.path(kind, name))
        if resp.status_code != 404:
            resp.raise_for_status()


# --- podman ---------------------------------------------------------------------------------------


async def podman(*args: str, check: bool = True, timeout: float = 120) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "podman", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"podman {args[0]} timed out after {timeout}s") from None
    text = out.decode(errors="replace").strip()
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:2])} failed ({proc.returncode}): {text[-800:]}")
    return proc.returncode or 0, text


# --- one pod ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class ProbeState:
    failures: int = 0
    successes: int = 0
    last_run: float = 0.0


@dataclasses.dataclass
class Pod:
    """What the podlet knows of one pod it runs."""

    obj: dict[str, Any]  # the Pod object as the podlet wrote it (metadata, spec)
    owner: tuple[str, str]  # (kind, name) of the controller
    revision: str
    ip: str = ""
    node: str = ""
    container: str = ""
    restarts: int = 0
    ready: bool = False
    started: bool = False  # startup probe passed (or none)
    running: bool = False
    state: dict[str, Any] = dataclasses.field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    terminating: bool = False
    initializing: bool = False
    init_restarts: int = 0
    init_last_state: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # init container -> last end
    last_logs: str = ""  # the last container run's logs (a termination message falls back to them)
    gone: bool = False
    task: asyncio.Task[None] | None = None
    started_at: float = 0.0
    reported: str = ""  # the last status written to the API (json), to write only changes

    @property
    def name(self) -> str:
        return self.obj["metadata"]["name"]

    @property
    def spec(self) -> dict[str, Any]:
        return self.obj["spec"]

    def phase(self) -> str:
        if not self.node:
            return "Pending"
        if self.initializing:
            return "Pending"
        return "Running" if self.running or self.restarts else "Pending"


def terminated_state(exit_code: int, written: str, logs: str, container: Mapping[str, Any]) -> dict[str, Any]:
    """A terminated state as the kubelet reports it: exit code, reason and the termination message: what the
    container wrote at terminationMessagePath (cut at 4096 bytes), else, with FallbackToLogsOnError and a failure,
    the last 80 lines of its log (cut at 2048 bytes)."""
    out: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    message = written[:4096]
    if not message.strip() and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        message = "\n".join(logs.splitlines()[-80:])[-2048:]
    if message.strip():
        out["message"] = message
    return out


class Podlet:
    """Controllers, scheduler and kubelet for one namespace (see the module docstring)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.api = Api(args.api, args.namespace)
        self.ns = args.namespace
        self.state = Path(args.state_dir)
        self.pods: dict[str, Pod] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.objects: dict[str, list[dict[str, Any]]] = {}
        net = ipaddress.ip_network(args.subnet)
        self.free_ips = [str(ip) for ip in list(net.hosts())[args.first_host : args.last_host]]
        self.stopping = False

    # --- the loop

    async def run(self) -> None:
        await self.register_nodes()
        while not self.stopping:
            started = time.monotonic()
            try:
                await self.tick()
            except (httpx.HTTPError, RuntimeError) as err:
                log.warning("tick failed: %s", err)
            await asyncio.sleep(max(0.0, self.args.interval - (time.monotonic() - started)))

    async def tick(self) -> None:
        kinds = (
            "Deployment",
            "StatefulSet",
            "Service",
            "ConfigMap",
            "Secret",
            "ServiceAccount",
            "PersistentVolumeClaim",
            "Pod",
        )
        cluster = ("Node", "PriorityClass")
        lists = await asyncio.gather(*(self.api.list(k) for k in (*kinds, *cluster)))
        self.objects = dict(zip((*kinds, *cluster), lists, strict=True))
        self.nodes = {
            n["metadata"]["name"]: n for n in self.objects.pop("Node") if n["metadata"]["name"] in self.own_nodes()
        }
        self.notice_deleted_pods()
        self.evict_from_lost_nodes()
        for dep in self.objects["Deployment"]:
            await self.reconcile_deployment(dep)
        for sts in self.objects["StatefulSet"]:
            await self.reconcile_statefulset(sts)
        self.remove_orphans()
        await self.publish_new_pods()
        await self.schedule_pending()
        await self.bind_claims()
        await self.write_statuses()
        self.write_endpoints()

    def own_nodes(self) -> set[str]:
        return {spec.split("=", 1)[0] for spec in self.args.node}

    # --- nodes

    async def register_nodes(self) -> None:
        """One Node object per --node NAME[=label=value,...], all of them this machine."""
        for spec in self.args.node:
            name, _, rest = spec.partition("=")
            labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
            for pair in filter(None, rest.split(",")):
                k, _, v = pair.partition("=")
                labels[k] = v
            cpu, mem = str(os.cpu_count() or 1), f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') // 1024}Ki"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": [parse_taint(t) for t in self.args.node_taint]},
                "status": {
                    "capacity": {"cpu": cpu, "memory": mem, "pods": "110"},
                    "allocatable": {"cpu": cpu, "memory": mem, "pods": "110"},
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now_iso()}
                    ],
                    "addresses": [
                        {"type": "InternalIP", "address": self.args.host_ip},
                        {"type": "Hostname", "address": name},
                    ],
                    "nodeInfo": {"kubeletVersion": "podlet", "containerRuntimeVersion": "podman"},
                },
            }
            await self.api.create("Node", node)
            log.info("node %s registered (labels %s)", name, labels)

    def evict_from_lost_nodes(self) -> None:
        """A deleted Node takes its pods with it (the machine went away): they are stopped and replaced."""
        for pod in list(self.pods.values()):
            if pod.node and pod.node not in self.nodes and not pod.terminating:
                log.info("pod %s: node %s is gone; terminating it", pod.name, pod.node)
                self.terminate(pod)

    # --- controllers

    def owned(self, kind: str, name: str) -> list[Pod]:
        return [p for p in self.pods.values() if p.owner == (kind, name) and not p.terminating]

    async def reconcile_deployment(self, dep: dict[str, Any]) -> None:
        name, spec = dep["metadata"]["name"], dep.get("spec") or {}
        revision = template_hash(spec.get("template") or {})
        for pod in self.owned("Deployment", name):
            if pod.revision != revision:
                log.info("deployment %s: template changed; replacing pod %s", name, pod.name)
                self.terminate(pod)
        current = self.owned("Deployment", name)
        want = int(spec.get("replicas", 1))
        # Scale down: the not-ready and newest first, as the ReplicaSet controller does.
        for pod in sorted(current, key=lambda p: (p.ready, -p.started_at))[: max(0, len(current) - want)]:
            log.info("deployment %s: scaling down, terminating pod %s", name, pod.name)
            self.terminate(pod)
        for _ in range(want - len(current)):
            pod_name = f"{name}-{revision[:9]}-{random_suffix()}"
            extra_labels = {"pod-template-hash": revision[:9]}
            self.add_pod(dep, pod_name, revision, extra_labels, {})

    async def reconcile_statefulset(self, sts: dict[str, Any]) -> None:
        name, spec = sts["metadata"]["name"], sts.get("spec") or {}
        revision = template_hash(spec.get("template") or {})
        want = int(spec.get("replicas", 1))
        existing = {p.name: p for p in self.pods.values() if p.owner == ("StatefulSet", name)}
        for pod in existing.values():
            ordinal = int(pod.name.rsplit("-", 1)[1])
            if not pod.terminating and (ordinal >= want or pod.revision != revision):
                log.info("statefulset %s: terminating pod %s (scale-down or new revision)", name, pod.name)
                self.terminate(pod)
        await self.ensure_claims(sts, want)
        ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
        for ordinal in range(want):
            pod_name = f"{name}-{ordinal}"
            if pod_name in self.pods:  # running, or still terminating: a StatefulSet waits for the old one
                if ordered and not self.pods[pod_name].ready:
                    return
                continue
            labels = {
                "apps.kubernetes.io/pod-index": str(ordinal),
                "statefulset.kubernetes.io/pod-name": pod_name,
                "controller-revision-hash": f"{name}-{revision[:9]}",
            }
            extra_spec = {"hostname": pod_name, "subdomain": spec.get("serviceName", "")}
            claims = {
                t["metadata"]["name"]: f"{t['metadata']['name']}-{pod_name}"
                for t in spec.get("volumeClaimTemplates") or []
            }
            self.add_pod(sts, pod_name, revision, labels, extra_spec, claims)
            if ordered:
                return

    async def ensure_claims(self, sts: dict[str, Any], replicas: int) -> None:
        """The StatefulSet controller's PVCs: one per template and ordinal, created once, never deleted here."""
        have = {p["metadata"]["name"] for p in self.objects["PersistentVolumeClaim"]}
        name = sts["metadata"]["name"]
        for tmpl in sts.get("spec", {}).get("volumeClaimTemplates") or []:
            for ordinal in range(replicas):
                claim = f"{tmpl['metadata']['name']}-{name}-{ordinal}"
                if claim in have:
                    continue
                labels = dict((sts["spec"].get("selector") or {}).get("matchLabels") or {})
                pvc = {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim, "namespace": self.ns, "labels": labels},
                    "spec": tmpl.get("spec") or {},
                    "status": {"phase": "Bound"},
                }
                await self.api.create("PersistentVolumeClaim", pvc)
                self.objects["PersistentVolumeClaim"].append(pvc)
                log.info("statefulset %s: created PVC %s", name, claim)

    def add_pod(
        self,
        owner: dict[str, Any],
        pod_name: str,
        revision: str,
        extra_labels: dict[str, str],
        extra_spec: dict[str, Any],
        claims: dict[str, str] | None = None,
    ) -> None:
        template = json.loads(json.dumps(owner["spec"].get("template") or {}))
        spec = template.get("spec") or {}
        if not self.admit_priority(owner, spec):
            return
        spec.update({k: v for k, v in extra_spec.items() if v})
        # volumeClaimTemplates become persistentVolumeClaim volumes of the pod's own claims.
        for vol_name, claim in (claims or {}).items():
            spec.setdefault("volumes", []).append({"name": vol_name, "persistentVolumeClaim": {"claimName": claim}})
        meta = template.get("metadata") or {}
        obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.ns,
                "labels": {**(meta.get("labels") or {}), **extra_labels},
                "annotations": meta.get("annotations") or {},
                "finalizers": [FINALIZER],
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"].get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"restartPolicy": "Always", "terminationGracePeriodSeconds": 30, **spec},
        }
        obj["metadata"]["uid"] = os.urandom(8).hex()
        pod = Pod(obj=obj, owner=(owner["kind"], owner["metadata"]["name"]), revision=revision)
        self.pods[pod_name] = pod
        log.info("%s %s: new pod %s", owner["kind"].lower(), owner["metadata"]["name"], pod_name)

    def admit_priority(self, owner: dict[str, Any], spec: dict[str, Any]) -> bool:
        """The Priority admission plugin: a pod naming a PriorityClass that does not exist is refused (its controller
        creates none: FailedCreate); one that does gets the class's priority."""
        name = spec.get("priorityClassName")
        if not name:
            return True
        found = next((c for c in self.objects.get("PriorityClass", []) if c["metadata"]["name"] == name), None)
        if found is None:
            log.warning(
                "%s %s: FailedCreate: no PriorityClass %r", owner["kind"].lower(), owner["metadata"]["name"], name
            )
            return False
        spec["priority"] = int(found.get("value", 0))
        return True

    def remove_orphans(self) -> None:
        """Pods whose Deployment or StatefulSet is gone (garbage collection of the controller's pods)."""
        alive = {(k, o["metadata"]["name"]) for k in ("Deployment", "StatefulSet") for o in self.objects[k]}
        for pod in list(self.pods.values()):
            if pod.owner not in alive and not pod.terminating:
                log.info("pod %s: its %s %s is gone; terminating it", pod.name, *pod.owner)
                self.terminate(pod)

    def notice_deleted_pods(self) -> None:
        """A Pod deleted through the API (kubectl delete pod, an eviction): stop it, gracefully."""
        in_api = {p["metadata"]["name"]: p for p in self.objects["Pod"]}
        for pod in list(self.pods.values()):
            if not pod.reported or pod.terminating:
                continue
            obj = in_api.get(pod.name)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                log.info("pod %s: deleted through the API; terminating it", pod.name)
                self.terminate(pod)

    # --- scheduler

    async def publish_new_pods(self) -> None:
        """New pods appear in the API at once, Pending, as the controllers create them."""
        for pod in list(self.pods.values()):
            if not pod.reported and not pod.terminating:
                await self.create_pod_object(pod)

    async def bind_claims(self) -> None:
        """Every PVC is Bound at once (the lane's storage is a directory per claim)."""
        for pvc in self.objects["PersistentVolumeClaim"]:
            if (pvc.get("status") or {}).get("phase") != "Bound":
                await self.api.patch("PersistentVolumeClaim", pvc["metadata"]["name"], {"status": {"phase": "Bound"}})

    async def schedule_pending(self) -> None:
        for pod in list(self.pods.values()):
            if pod.node or pod.terminating:
                continue
            fits = [n for n in self.nodes.values() if node_fits(pod.spec, n)]
            if not fits:
                continue
            load = {n["metadata"]["name"]: 0 for n in fits}
            for other in self.pods.values():
                if other.node in load and not other.terminating:
                    load[other.node] += 1
            pod.node = min(load, key=lambda n: (load[n], n))
            pod.spec["nodeName"] = pod.node
            pod.ip = self.free_ips.pop(0)
            await self.api.patch("Pod", pod.name, {"spec": {"nodeName": pod.node}})
            log.info("pod %s: scheduled on %s at %s", pod.name, pod.node, pod.ip)
            pod.task = asyncio.create_task(self.run_pod(pod), name=f"pod {pod.name}")

    # --- kubelet: one pod's life

    def terminate(self, pod: Pod) -> None:
        pod.terminating = True
        pod.ready = False
        if pod.task is None:  # never started: nothing to stop
            pod.gone = True
            asyncio.create_task(self.forget(pod))

    async def forget(self, pod: Pod) -> None:
        """The pod is over: its Pod object goes (finalizer released), its emptyDirs and IP are freed."""
        with contextlib.suppress(httpx.HTTPError, RuntimeError):  # RuntimeError: the client closed at exit
            await self.api.patch("Pod", pod.name, {"metadata": {"finalizers": []}})
            await self.api.delete("Pod", pod.name)
        shutil.rmtree(self.pod_dir(pod), ignore_errors=True)
        if pod.ip:
            self.free_ips.append(pod.ip)
        if self.pods.get(pod.name) is pod:
            del self.pods[pod.name]
        log.info("pod %s: gone", pod.name)

    def pod_dir(self, pod: Pod) -> Path:
        return self.state / "pods" / f"{pod.name}-{pod.obj['metadata'].get('uid', '')}"

    async def run_pod(self, pod: Pod) -> None:
        """Start the container, restart it on exit or failed liveness (with back-off), until terminated."""
        try:
            containers = pod.spec.get("containers") or []
            if len(containers) != 1:
                raise RuntimeError("the podlet runs pods of exactly one container (and any init containers)")
            container = containers[0]
            await self.run_init_containers(pod)
            backoff = BACKOFF_START_S
            while not pod.terminating:
                try:
                    await self.start_container(pod, container)
                except (RuntimeError, ValueError, OSError) as err:
                    log.error("pod %s: cannot start: %s", pod.name, err)
                    pod.state = {"waiting": {"reason": "CreateContainerError", "message": str(err)[:500]}}
                    await self.wait_or_terminated(pod, backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                reason = await self.supervise(pod, container)
                if pod.terminating:
                    break
                exit_code = await self.remove_container(pod, grace=self.grace(pod))
                pod.restarts += 1
                pod.running = False
                pod.last_state = {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now_iso()}}
                if time.monotonic() - pod.started_at > BACKOFF_RESET_S:
                    backoff = BACKOFF_START_S
                log.warning(
                    "pod %s: container ended (%s, exit %s); restart %d in %.0fs",
                    pod.name,
                    reason,
                    exit_code,
                    pod.restarts,
                    backoff,
                )
                pod.state = {"waiting": {"reason": "CrashLoopBackOff"}}
                await self.wait_or_terminated(pod, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        except Exception as err:  # one pod's failure must not take the podlet down
            log.exception("pod %s: %s", pod.name, err)
        finally:
            if pod.container:
                with contextlib.suppress(Exception):
                    await self.remove_container(pod, grace=self.grace(pod))
            pod.gone = True
            await self.forget(pod)

    async def run_init_containers(self, pod: Pod) -> None:
        """Each init container in order, to exit 0 (a failed one is retried with back-off, as restartPolicy Always)."""
        for init in pod.spec.get("initContainers") or []:
            backoff = BACKOFF_START_S
            while not pod.terminating:
                pod.initializing = True
                try:
                    await self.start_container(pod, init)
                except (RuntimeError, ValueError, OSError) as err:
                    log.error("pod %s: cannot start init container %s: %s", pod.name, init.get("name"), err)
                    await self.wait_or_terminated(pod, backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    continue
                pod.running = False
                pod.state = {"waiting": {"reason": "PodInitializing"}}
                waiter = asyncio.create_task(podman("wait", pod.container, check=False, timeout=10**7))
                while not waiter.done() and not pod.terminating:
                    await asyncio.wait({waiter}, timeout=0.5)
                if pod.terminating:
                    waiter.cancel()
                    return
                exit_code = await self.remove_container(pod, grace=self.grace(pod))
                if exit_code == 0:
                    log.info("pod %s: init container %s completed", pod.name, init.get("name"))
                    break
                pod.init_last_state[init.get("name", "")] = {"terminated": self.terminated(pod, init, exit_code)}
                pod.init_restarts += 1
                log.warning(
                    "pod %s: init container %s failed (exit %s); retry in %.0fs",
                    pod.name,
                    init.get("name"),
                    exit_code,
                    backoff,
                )
                pod.state = {"waiting": {"reason": "Init:CrashLoopBackOff"}}
                await self.wait_or_terminated(pod, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        pod.initializing = False

    async def wait_or_terminated(self, pod: Pod, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not pod.terminating and time.monotonic() < deadline:
            await asyncio.sleep(0.5)

    def termination_file(self, pod: Pod, container: dict[str, Any]) -> Path:
        """The host file bind-mounted at the container's terminationMessagePath (as the kubelet does)."""
        return self.pod_dir(pod) / "termination" / container.get("name", "")

    def terminated(self, pod: Pod, container: dict[str, Any], exit_code: int) -> dict[str, Any]:
        """The container's terminated state, from the file it wrote at terminationMessagePath and its last logs."""
        try:
            written = self.termination_file(pod, container).read_text(errors="replace")
        except OSError:
            written = ""
        return {**terminated_state(exit_code, written, pod.last_logs, container), "finishedAt": now_iso()}

    def grace(self, pod: Pod) -> int:
        return int(pod.spec.get("terminationGracePeriodSeconds", 30))

    async def create_pod_object(self, pod: Pod) -> None:
        body = {**pod.obj, "status": self.pod_status(pod)}
        await self.api.create("Pod", body)
        pod.reported = json.dumps(body["status"], sort_keys=True)

    async def supervise(self, pod: Pod, container: dict[str, Any]) -> str:
        """Probes until the container exits, a liveness probe fails, or the pod is terminated; returns why."""
        waiter = asyncio.create_task(podman("wait", pod.container, check=False, timeout=10**7))
        probes = {kind: ProbeState() for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
        pod.started = "startupProbe" not in container
        pod.ready = "readinessProbe" not in container
        try:
            while not waiter.done():
                if pod.terminating:
                    return "Terminated"
                verdict = await self.run_probes(pod, container, probes)
                if verdict:
                    return verdict
                await asyncio.wait({waiter}, timeout=0.5)
            return "Completed" if waiter.result()[1].strip() == "0" else "Error"
        finally:
            pod.ready = False
            if not waiter.done():
                waiter.cancel()

    async def run_probes(self, pod: Pod, container: dict[str, Any], probes: dict[str, ProbeState]) -> str:
        since_start = time.monotonic() - pod.started_at
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container.get(kind)
            if not probe or (kind != "startupProbe" and not pod.started) or (kind == "startupProbe" and pod.started):
                continue
            cfg = {**PROBE_DEFAULTS, **probe}
            st = probes[kind]
            if since_start < cfg["initialDelaySeconds"] or time.monotonic() - st.last_run < cfg["periodSeconds"]:
                continue
            st.last_run = time.monotonic()
            ok = await self.probe(pod, container, probe, float(cfg["timeoutSeconds"]))
            st.failures, st.successes = (0, st.successes + 1) if ok else (st.failures + 1, 0)
            if kind == "startupProbe":
                pod.started = pod.started or ok
                if st.failures >= cfg["failureThreshold"]:
                    return "StartupProbeFailed"
            elif kind == "readinessProbe":
                if ok and st.successes >= int(probe.get("successThreshold", 1)):
                    pod.ready = True
                elif not ok and st.failures >= cfg["failureThreshold"]:
                    pod.ready = False
            elif st.failures >= cfg["failureThreshold"]:
                log.warning("pod %s: liveness probe failed %d times", pod.name, st.failures)
                return "LivenessProbeFailed"
        if "readinessProbe" not in container:
            pod.ready = pod.started
        return ""

    async def probe(self, pod: Pod, container: dict[str, Any], probe: dict[str, Any], timeout: float) -> bool:
        """One probe, from the host to the pod's address (the kubelet probes from the node)."""
        try:
            if "httpGet" in probe:
                get = probe["httpGet"]
                port = container_port(container, get.get("port", 80))
                host = get.get("host") or pod.ip
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                scheme = get.get("scheme", "HTTP").lower()
                async with httpx.AsyncClient(timeout=timeout, verify=False) as http:  # noqa: S501 (kubelet skips verification)
                    resp = await http.get(f"{scheme}://{host}:{port}{get.get('path', '/')}", headers=headers)
                return 200 <= resp.status_code < 400
            if "tcpSocket" in probe:
                port = container_port(container, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(asyncio.open_connection(pod.ip, port), timeout)
                writer.close()
                return True
            if "exec" in probe:
                rc, _ = await podman("exec", pod.container, *probe["exec"]["command"], check=False, timeout=timeout + 5)
                return rc == 0
        except (httpx.HTTPError, OSError, TimeoutError, RuntimeError):
            return False
        log.warning("pod %s: unsupported probe %s (counted as passing)", pod.name, sorted(probe))
        return True

    async def start_container(self, pod: Pod, container: dict[str, Any]) -> None:
        # The tick's lists are fetched concurrently, so they may show a Deployment without the Service created just
        # after it. DNS names are fixed when the container starts (podman network aliases, unlike cluster DNS):
        # list the Services again now, after the pod's workload was seen, so none created before it is missed.
        with contextlib.suppress(httpx.HTTPError):  # the tick's list, then
            self.objects["Service"] = await self.api.list("Service")
        argv = self.podman_run_args(pod, container)
        pod.container = f"{self.args.run_id}-{pod.name}"
        await podman("rm", "-f", "-t", "0", pod.container, check=False)
        await podman(*argv)
        pod.started_at = time.monotonic()
        pod.running = True
        pod.state = {"running": {"startedAt": now_iso()}}
        log.info("pod %s: container started (%s)", pod.name, container.get("image"))

    async def remove_container(self, pod: Pod, grace: int) -> int:
        """SIGTERM, then SIGKILL after the grace period (podman stop -t); the container's log is kept."""
        name = pod.container
        _, inspect = await podman("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name, check=False)
        if inspect.startswith("true"):
            log.info("pod %s: stopping the container (SIGTERM, grace %ds)", pod.name, grace)
            t0 = time.monotonic()
            await podman("stop", "-t", str(grace), name, check=False, timeout=grace + 60)
            log.info("pod %s: container stopped in %.1fs", pod.name, time.monotonic() - t0)
            _, inspect = await podman(
                "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name, check=False
            )
        _, logs = await podman("logs", name, check=False, timeout=60)
        pod.last_logs = logs
        logs_dir = self.state / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        with (logs_dir / f"{pod.name}.log").open("a") as f:
            f.write(f"----- container run ending {now_iso()} -----\n{logs}\n")
        await podman("rm", "-f", "-t", "0", name, check=False)
        pod.container = ""
        parts = inspect.split()
        return int(parts[1]) if len(parts) == 2 and parts[1].lstrip("-").isdigit() else -1

    # --- the container's definition

    def podman_run_args(self, pod: Pod, container: dict[str, Any]) -> list[str]:
        spec, meta = pod.spec, pod.obj["metadata"]
        env = self.container_env(pod, container)
        services = self.objects.get("Service", [])
        net = f"{self.args.network}:ip={pod.ip}" + "".join(f",alias={a}" for a in dns_aliases(pod.obj, services))
        name = f"{self.args.run_id}-{pod.name}"
        argv = ["run", "-d", "--name", name, "--pull", "never", "--log-driver", "k8s-file", "--network", net]
        argv += ["--hostname", spec.get("hostname") or pod.name]
        argv += ["--label", f"rlboost-lane={self.args.run_id}", "--label", f"io.kubernetes.pod.name={pod.name}"]
        argv += ["--label", f"io.kubernetes.pod.namespace={meta['namespace']}"]
        argv += ["--stop-timeout", str(self.grace(pod))]
        argv += self.security_args(spec, container)
        for key, value in env.items():
            argv += ["--env", f"{key}={value}"]
        argv += self.volume_args(pod, container)
        argv += self.termination_args(pod, container)
        if container.get("workingDir"):
            argv += ["--workdir", container["workingDir"]]
        command = [expand(c, env) for c in container.get("command") or []]
        args = [expand(a, env) for a in container.get("args") or []]
        if command:
            argv += ["--entrypoint", json.dumps(command)]
        argv.append(container["image"])
        return argv + args

    def termination_args(self, pod: Pod, container: dict[str, Any]) -> list[str]:
        """A fresh, empty termination message file, writable by any user, at terminationMessagePath."""
        host = self.termination_file(pod, container)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_text("")
        host.chmod(0o666)
        return ["--volume", f"{host}:{container.get('terminationMessagePath') or TERMINATION_PATH}:rw"]

    def security_args(self, spec: dict[str, Any], container: dict[str, Any]) -> list[str]:
        psc, csc = spec.get("securityContext") or {}, container.get("securityContext") or {}
        out: list[str] = []
        uid, gid = csc.get("runAsUser", psc.get("runAsUser")), csc.get("runAsGroup", psc.get("runAsGroup"))
        if uid is not None:
            out += ["--user", f"{uid}:{gid if gid is not None else 0}"]
        elif csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            log.info("runAsNonRoot without runAsUser: the image's USER must be non-root")
        for group in [psc.get("fsGroup"), *(psc.get("supplementalGroups") or [])]:
            if group is not None:
                out += ["--group-add", str(group)]
        caps = csc.get("capabilities") or {}
        out += [f"--cap-drop={c.lower()}" for c in caps.get("drop") or []]
        out += [f"--cap-add={c.lower()}" for c in caps.get("add") or []]
        if csc.get("allowPrivilegeEscalation") is False:
            out += ["--security-opt", "no-new-privileges"]
        if csc.get("readOnlyRootFilesystem"):
            out.append("--read-only")
        if csc.get("privileged"):
            out.append("--privileged")
        return out

    def container_env(self, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
        """Service links first, then envFrom, then env in order (later wins, $(VAR) sees earlier ones)."""
        env: dict[str, str] = {}
        if pod.spec.get("enableServiceLinks", True):
            env.update(service_link_env(self.objects.get("Service", []), self.service_ips()))
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            if "configMapRef" in src:
                data = self.config_data("ConfigMap", src["configMapRef"]["name"], src["configMapRef"].get("optional"))
            else:
                data = self.config_data("Secret", src["secretRef"]["name"], src["secretRef"].get("optional"))
            env.update({prefix + k: v.decode(errors="replace") for k, v in data.items()})
        status = {"podIP": pod.ip, "hostIP": self.args.host_ip}
        view = {**pod.obj, "status": status}
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
            elif "valueFrom" in item:
                env[item["name"]] = self.env_from_ref(item["name"], item["valueFrom"], view)
            else:
                env[item["name"]] = ""
        return env

    def env_from_ref(self, name: str, ref: dict[str, Any], pod_view: dict[str, Any]) -> str:
        if "fieldRef" in ref:
            return field_ref(ref["fieldRef"]["fieldPath"], pod_view)
        for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            if key in ref:
                sel = ref[key]
                data = self.config_data(kind, sel["name"], sel.get("optional"))
                if sel["key"] not in data:
                    if sel.get("optional"):
                        return ""
                    raise ValueError(f"env {name}: key {sel['key']!r} not in {kind} {sel['name']!r}")
                return data[sel["key"]].decode(errors="replace")
        raise ValueError(f"env {name}: valueFrom {sorted(ref)} is not supported by the podlet")

    def config_data(self, kind: str, name: str, optional: bool | None = False) -> dict[str, bytes]:
        """A ConfigMap's or Secret's data as bytes (Secret values are base64 in the API)."""
        for obj in self.objects.get(kind, []):
            if obj["metadata"]["name"] == name:
                if kind == "Secret":
                    out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
                    out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
                    return out
                out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
                out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
                return out
        if optional:
            return {}
        raise ValueError(f"{kind} {name!r} not found in namespace {self.ns!r}")

    def volume_args(self, pod: Pod, container: dict[str, Any]) -> list[str]:
        fs_group = (pod.spec.get("securityContext") or {}).get("fsGroup")
        sources = {v["name"]: self.volume_dir(pod, v, fs_group) for v in pod.spec.get("volumes") or []}
        memory = {v["name"]: v["emptyDir"] for v in pod.spec.get("volumes") or [] if memory_backed(v)}
        out: list[str] = []
        for mount in container.get("volumeMounts") or []:
            if mount["name"] in memory:  # medium Memory: a tmpfs of its sizeLimit, as the kubelet mounts it
                out += ["--mount", tmpfs_mount(mount["mountPath"], memory[mount["name"]].get("sizeLimit"))]
                continue
            src = sources.get(mount["name"])
            if src is None:
                raise ValueError(f"volumeMount {mount['name']!r} names no volume of the pod")
            if mount.get("subPath"):
                src = src / mount["subPath"]
                if not src.exists():  # the kubelet creates a missing subPath as a directory
                    src.mkdir(parents=True)
            opts = "ro" if mount.get("readOnly") else "rw"
            out += ["--volume", f"{src}:{mount['mountPath']}:{opts}"]
        return out

    def volume_dir(self, pod: Pod, volume: dict[str, Any], fs_group: int | None) -> Path:
        """The host directory behind one pod volume, filled for ConfigMaps and Secrets."""
        base = self.pod_dir(pod) / "volumes" / volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = volume["persistentVolumeClaim"]["claimName"]
            if not any(p["metadata"]["name"] == claim for p in self.objects.get("PersistentVolumeClaim", [])):
                raise ValueError(f"persistentvolumeclaim {claim!r} not found")
            path = self.state / "pvc" / claim
            path.mkdir(parents=True, exist_ok=True)
            self.own(path, fs_group, 0o2775)
            return path
        if "emptyDir" in volume:
            base.mkdir(parents=True, exist_ok=True)
            base.chmod(0o777)
            return base
        if "projected" in volume:
            files = projected_token_files(volume, pod.obj, self.objects.get("ServiceAccount", []), self.signing_key())
            base.mkdir(parents=True, exist_ok=True)
            mode = int(volume["projected"].get("defaultMode", 0o644))
            for rel, data in files.items():  # written anew at each container start: a fresh token
                (base / rel).parent.mkdir(parents=True, exist_ok=True)
                (base / rel).write_bytes(data)
                self.own(base / rel, fs_group, mode)
            self.own(base, fs_group, 0o755)
            return base
        for kind, key, name_key in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName")):
            if key in volume:
                src = volume[key]
                data = self.config_data(kind, src[name_key], src.get("optional"))
                mode = int(src.get("defaultMode", 0o644))
                if base.exists():  # a restart: files as written at the pod's start (no live updates)
                    return base
                base.mkdir(parents=True)
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    target = base / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(data[item["key"]])
                    self.own(target, fs_group, int(item.get("mode", mode)))
                self.own(base, fs_group, 0o755)
                return base
        raise ValueError(
            f"volume {volume['name']!r}: only configMap, secret, emptyDir, PVC and projected serviceAccountToken "
            "volumes are emulated"
        )

    def signing_key(self) -> Any:
        if not self.args.signing_key:
            raise ValueError("a projected serviceAccountToken volume needs the podlet's --signing-key")
        return sa_tokens.load_or_make_key(Path(self.args.signing_key))

    @staticmethod
    def own(path: Path, group: int | None, mode: int) -> None:
        if group is not None:
            os.chown(path, 0, int(group))
        path.chmod(mode)

    # --- status

    def service_ips(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for svc in self.objects.get("Service", []):
            sel = (svc.get("spec") or {}).get("selector")
            out[svc["metadata"]["name"]] = [
                p.ip for p in self.pods.values() if p.ip and labels_match(sel, p.obj["metadata"].get("labels") or {})
            ]
        return out

    def pod_status(self, pod: Pod) -> dict[str, Any]:
        container = (pod.spec.get("containers") or [{}])[0]
        ts = now_iso()

        def cond(kind: str, ok: bool) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": ts}

        status: dict[str, Any] = {
            "phase": pod.phase(),
            "conditions": [
                cond("PodScheduled", bool(pod.node)),
                cond("Initialized", not pod.initializing),
                cond("ContainersReady", pod.ready),
                cond("Ready", pod.ready),
            ],
            "qosClass": "Burstable",
        }
        if pod.node:
            status.update(hostIP=self.args.host_ip, podIP=pod.ip, podIPs=[{"ip": pod.ip}])
            status["containerStatuses"] = [
                {
                    "name": container.get("name", ""),
                    "image": container.get("image", ""),
                    "imageID": "",
                    "containerID": f"podman://{pod.container}" if pod.container else "",
                    "ready": pod.ready,
                    "started": pod.running and pod.started,
                    "restartCount": pod.restarts,
                    "state": pod.state,
                    "lastState": pod.last_state,
                }
            ]
            inits = pod.spec.get("initContainers") or []
            if inits:
                done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
                status["initContainerStatuses"] = [
                    {
                        "name": c.get("name", ""),
                        "image": c.get("image", ""),
                        "ready": not pod.initializing,
                        "restartCount": pod.init_restarts,
                        "state": pod.state if pod.initializing else done,
                        "lastState": pod.init_last_state.get(c.get("name", ""), {}),
                    }
                    for c in inits
                ]
        else:
            status["conditions"][0].update(
                reason="Unschedulable", message="no node fits the pod's selector, affinity and tolerations"
            )
        return status

    @staticmethod
    def status_key(status: dict[str, Any]) -> str:
        """A pod status without its timestamps, to write only what changed."""
        conditions = [(c.get("type"), c.get("status")) for c in status.get("conditions") or []]
        return json.dumps({**status, "conditions": conditions}, sort_keys=True)

    async def write_statuses(self) -> None:
        """Each pod's status, whenever the API's copy differs from the kubelet's view (whoever else wrote it)."""
        in_api = {p["metadata"]["name"]: p.get("status") or {} for p in self.objects["Pod"]}
        for pod in list(self.pods.values()):
            if not pod.reported or pod.terminating:
                continue
            status = self.pod_status(pod)
            key = self.status_key(status)
            theirs = {k: v for k, v in in_api.get(pod.name, {}).items() if k in status}  # fields the kubelet owns
            if key != self.status_key(theirs) and await self.api.patch("Pod", pod.name, {"status": status}):
                pod.reported = key
        for kind in ("Deployment", "StatefulSet"):
            for obj in self.objects[kind]:
                await self.write_controller_status(kind, obj)

    async def write_controller_status(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        revision = template_hash(obj.get("spec", {}).get("template") or {})
        pods = self.owned(kind, name)
        ready = sum(p.ready for p in pods)
        want = int(obj.get("spec", {}).get("replicas", 1))
        status: dict[str, Any] = {
            "observedGeneration": obj["metadata"].get("generation", 1),
            "replicas": len(pods),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": sum(p.revision == revision for p in pods),
        }
        if kind == "Deployment":
            status["unavailableReplicas"] = max(0, want - ready)
            status["conditions"] = [
                {
                    "type": "Available",
                    "status": "True" if ready >= want else "False",
                    "reason": "MinimumReplicasAvailable" if ready >= want else "MinimumReplicasUnavailable",
                }
            ]
        else:
            status["currentReplicas"] = len(pods)
            status["currentRevision"] = status["updateRevision"] = f"{name}-{revision[:9]}"
        old = obj.get("status") or {}
        if any(old.get(k) != v for k, v in status.items() if k != "conditions"):
            await self.api.patch(kind, name, {"status": status})

    def write_endpoints(self) -> None:
        """Each Service's pods (the Endpoints controller's view), for the lane's Prometheus targets."""
        out: dict[str, Any] = {}
        for svc in self.objects.get("Service", []):
            spec = svc.get("spec") or {}
            out[svc["metadata"]["name"]] = {
                "labels": svc["metadata"].get("labels") or {},
                "ports": spec.get("ports") or [],
                "pods": [
                    {
                        "name": p.name,
                        "ip": p.ip,
                        "ready": p.ready,
                        "labels": p.obj["metadata"].get("labels") or {},
                        "ports": {
                            cp["name"]: cp["containerPort"]
                            for c in p.spec.get("containers") or []
                            for cp in c.get("ports") or []
                            if cp.get("name")
                        },
                    }
                    for p in self.pods.values()
                    if p.ip
                    and p.running
                    and not p.terminating
                    and labels_match(spec.get("selector"), p.obj["metadata"].get("labels") or {})
                ],
            }
        pods = [
            {
                "name": p.name,
                "ip": p.ip,
                "ready": p.ready,
                "labels": p.obj["metadata"].get("labels") or {},
                "ports": {
                    cp["name"]: cp["containerPort"]
                    for c in p.spec.get("containers") or []
                    for cp in c.get("ports") or []
                    if cp.get("name")
                },
            }
            for p in self.pods.values()
            if p.ip and p.running and not p.terminating
        ]
        for name, data in (("endpoints.json", out), ("pods.json", pods)):
            tmp = self.state / f"{name}.tmp"
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self.state / name)

    # --- shutdown

    async def shutdown(self, grace: int) -> None:
        """Stop every pod (SIGTERM, at most `grace` seconds each, all at once) and remove its container."""
        self.stopping = True
        for pod in self.pods.values():
            pod.spec["terminationGracePeriodSeconds"] = min(self.grace(pod), grace)
            pod.terminating = True
        tasks = [p.task for p in self.pods.values() if p.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace + 90)
        await self.api.http.aclose()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="The cluster lane's stand-in for the kubelet and workload controllers.")
    p.add_argument("--api", required=True, help="URL of the Kubernetes API (kmock)")
    p.add_argument("--namespace", default="default", help="namespace whose workloads the podlet runs")
    p.add_argument("--network", required=True, help="podman network the pods join")
    p.add_argument("--subnet", required=True, help="that network's subnet (pods get addresses in it)")
    p.add_argument("--first-host", type=int, default=99, help="pods' addresses start at this host index")
    p.add_argument("--last-host", type=int, default=250, help="...and end before this one")
    p.add_argument("--host-ip", required=True, help="the machine's address on the network (Node InternalIP)")
    p.add_argument("--state-dir", required=True, help="volumes, logs and endpoints.json go here")
    p.add_argument("--run-id", required=True, help="prefix of container names; label rlboost-lane=<run-id>")
    p.add_argument("--node", action="append", default=[], help="NAME[=label=value,...]; repeatable (default one node)")
    p.add_argument(
        "--node-taint", action="append", default=[], help="KEY=VALUE:EFFECT on every node; repeatable (a team's taint)"
    )
    p.add_argument("--signing-key", default="", help="service-account signing key (kube_api.py's) for pods' tokens")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reconciliations")
    p.add_argument("--shutdown-grace", type=int, default=10, help="most seconds each pod gets on podlet exit")
    args = p.parse_args(argv)
    args.node = args.node or ["lane-node-0"]
    return args


async def amain(args: argparse.Namespace) -> None:
    podlet = Podlet(args)
    Path(args.state_dir).mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = asyncio.create_task(podlet.run())
    await asyncio.wait({runner, asyncio.create_task(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping: terminating every pod")
    podlet.stopping = True
    runner.cancel()  # no controller may replace the pods being stopped
    with contextlib.suppress(asyncio.CancelledError):
        await runner
    await podlet.shutdown(args.shutdown_grace)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s podlet %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    asyncio.run(amain(parse_args()))


if __name__ == "__main__":
    main()
