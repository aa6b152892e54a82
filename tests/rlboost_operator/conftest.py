"""Fixtures for the operator: a Kubernetes API served by kmock on loopback (its own thread and loop),
and the operator itself under kopf.testing.KopfRunner.

kmock's emulator stores objects in memory, merges patches as plain dicts, replays every object on
each watch and runs no controllers (no garbage collection, no Pods from Deployments): tests create
Pods and Nodes themselves and check ownerReferences rather than cascading deletion.

kmock serves any declared resource, Leases included, but it has no PUT (replace) and keeps no
resourceVersion. Leader election needs both, so for Leases the Emulator below adds what the API
server does: a resourceVersion set on create and bumped on each replace, and a replace carrying a
stale one answered 409 Conflict.

kmock serves no OIDC discovery: the fixture adds the API server's `/.well-known/openid-configuration` and
`/openid/v1/jwks` for a key pair of its own (`ClusterDiscovery`; a test rotates the key, or makes the endpoints
refuse, as a cluster could).

KopfRunner runs kopf in a thread of the test process, so a test can read the operator's in-process state: the
collaborators its startup handler put in kopf's memo (`operator_memo()`, kept by a startup handler of the tests').
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import kopf
import pytest
from aiohttp import web

from rlboost.nats_server import NatsServer, free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "cluster"))  # the lane's kmock additions
import kube_api as lane_api  # noqa: E402

from tests.helpers import wait_until

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
RESOURCES = {
    # kopf's own backbone: it waits for these to exist before starting any watch.
    "v1/namespaces": dict(kind="Namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(kind="CustomResourceDefinition", namespaced=False),
    "rlboost.io/v1alpha1/rljobs": dict(kind="RLJob", namespaced=True, subresources={"status"}),
    "v1/nodes": dict(kind="Node", namespaced=False),
    "v1/pods": dict(kind="Pod", namespaced=True),
    "v1/events": dict(kind="Event", namespaced=True),
    "v1/configmaps": dict(kind="ConfigMap", namespaced=True),
    "v1/secrets": dict(kind="Secret", namespaced=True),
    "v1/services": dict(kind="Service", namespaced=True),
    "v1/serviceaccounts": dict(kind="ServiceAccount", namespaced=True),
    "v1/persistentvolumeclaims": dict(kind="PersistentVolumeClaim", namespaced=True),
    "apps/v1/deployments": dict(kind="Deployment", namespaced=True),
    "apps/v1/statefulsets": dict(kind="StatefulSet", namespaced=True),
    "networking.k8s.io/v1/networkpolicies": dict(kind="NetworkPolicy", namespaced=True),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", namespaced=True),
    "policy/v1/poddisruptionbudgets": dict(kind="PodDisruptionBudget", namespaced=True),
}


_STARTED: dict[str, Any] = {}  # "memo": the memo of the operator this process started last


@kopf.on.startup(id="tests: keep the operator's memo")
async def keep_memo(memo: kopf.Memo, **_: Any) -> None:
    """Registered with kopf's default registry, as the operator's handlers are: each operator a test starts runs it
    (before or after the operator's own startup: the memo is one object, which that startup fills)."""
    _STARTED["memo"] = memo


def operator_memo() -> Any:
    """The memo of the operator started last in this process (`memo.jobs`, `memo.sizer`, ...: startup.fill_memo)."""
    assert "memo" in _STARTED, "no operator was started in this process"
    return _STARTED["memo"]


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason}
    return web.json_response({**body, "message": message}, status=code)


ISSUER = "https://kubernetes.default.svc.cluster.local"
DISCOVERY_PATHS = ("/.well-known/openid-configuration", "/openid/v1/jwks")


@dataclass
class ClusterDiscovery:
    """What the fixture's API server publishes for its service-account tokens: the issuer and the public key of
    `key` (an EC P-256 key, as a kubelet's tokens could be signed with); `refuse`: answer this HTTP status instead;
    `gate`: while this Event is clear, requests wait for it (an API server that does not answer)."""

    key: Any = None
    kid: str = ""
    refuse: int | None = None
    gate: threading.Event | None = None
    served: int = 0  # requests answered at the discovery endpoints
    held: int = 0  # requests that waited at the gate

    async def wait_at_gate(self) -> None:
        if self.gate is not None and not self.gate.is_set():
            self.held += 1
            await asyncio.to_thread(self.gate.wait)

    def rotate(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.key, self.kid = ec.generate_private_key(ec.SECP256R1()), uuid.uuid4().hex

    def jwks(self) -> dict[str, Any]:
        from jwt.algorithms import ECAlgorithm

        jwk = {**ECAlgorithm.to_jwk(self.key.public_key(), as_dict=True), "kid": self.kid, "use": "sig", "alg": "ES256"}
        return {"keys": [jwk]}

    def answer(self, path: str) -> web.Response | None:
        """The API server's answer at `path`, if it is one of the discovery endpoints."""
        bodies = {"/.well-known/openid-configuration": lambda: {"issuer": ISSUER}, "/openid/v1/jwks": self.jwks}
        if path not in bodies:
            return None
        self.served += 1
        if self.refuse is not None:
            return _status(self.refuse, "Forbidden", f"cannot get path {path!r}")
        return web.json_response(bodies[path]())


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus `metadata.generateName` (kopf posts Events that way; kmock keys objects by name),
    optimistic concurrency for Leases and OIDC discovery (see the module docstring)."""

    _versions = itertools.count(1)
    discovery: ClusterDiscovery | None = None

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        if self.discovery is not None and request.method == kmock.method.GET:
            if request.url.path in DISCOVERY_PATHS:
                await self.discovery.wait_at_gate()
            answer = self.discovery.answer(request.url.path)
            if answer is not None:
                return answer
        data = request.data
        is_lease = request.resource is not None and request.resource.plural == "leases"
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
            if is_lease:
                meta["resourceVersion"] = str(next(self._versions))
        if is_lease and request.method == kmock.method.PUT and request.name:
            return await self._replace(request)
        return await super()._handle(request)

    async def _replace(self, request) -> web.Response:  # type: ignore[no-untyped-def]
        """PUT as the API server answers it (the lane's kube_api.replace): 404, 409 on a stale resourceVersion."""
        return await lane_api.replace(self, request, lambda: str(next(self._versions)))


@dataclass
class KubeApi:
    """The kmock emulator and a plain HTTP client to it (what kubectl would do)."""

    emulator: Emulator
    url: str
    http: httpx.Client
    discovery: ClusterDiscovery

    def path(self, kind: str, namespace: str | None, name: str | None = None) -> str:
        from rlboost_operator.kube import RESOURCES as NAMESPACED

        if kind == "Node":
            base = "/api/v1/nodes"
        elif kind == "Pod":
            base = f"/api/v1/namespaces/{namespace}/pods"
        elif kind == "Event":
            base = f"/api/v1/namespaces/{namespace}/events"
        else:
            prefix, plural = NAMESPACED[kind]
            base = f"{prefix}/namespaces/{namespace}/{plural}"
        return f"{base}/{name}" if name else base

    def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        resp = self.http.get(self.path(kind, namespace, name))
        return None if resp.status_code == 404 else resp.raise_for_status().json()

    def list(self, kind: str, namespace: str | None) -> list[dict[str, Any]]:
        return self.http.get(self.path(kind, namespace)).raise_for_status().json()["items"]

    def create(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.http.post(self.path(kind, obj["metadata"].get("namespace")), json=obj).raise_for_status().json()

    def patch(self, kind: str, namespace: str | None, name: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        return self.http.patch(self.path(kind, namespace, name), json=body, headers=headers).raise_for_status().json()

    def delete(self, kind: str, namespace: str | None, name: str) -> None:
        self.http.delete(self.path(kind, namespace, name)).raise_for_status()

    def watched(self, plural: str) -> bool:
        """Whether the operator has opened a watch on this resource."""
        return any(
            r.params.get("watch") == "true" and r.url.path.rstrip("/").endswith("/" + plural)
            for r in list(self.emulator)  # the emulator iterates over the requests it served
        )


@pytest.fixture
def kube_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    """kmock's Kubernetes emulator on a loopback port, in a thread of its own; KUBECONFIG points at it."""
    started = threading.Event()
    box: dict[str, Any] = {}
    discovery = ClusterDiscovery()
    discovery.rotate()

    async def serve() -> None:
        async with Emulator() as emulator, kmock.Server(emulator) as server:
            for key, info in RESOURCES.items():
                emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
            emulator.discovery = discovery
            box.update(
                emulator=emulator,
                url=str(server.url).rstrip("/"),
                stop=asyncio.Event(),
                loop=asyncio.get_running_loop(),
            )
            started.set()
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name="kmock", daemon=True)
    thread.start()
    assert started.wait(10), "kmock did not start"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters: [{{name: kmock, cluster: {{server: '{box['url']}'}}}}]\n"
        "users: [{name: kmock, user: {token: test}}]\n"
        "contexts: [{name: kmock, context: {cluster: kmock, user: kmock, namespace: default}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with httpx.Client(base_url=box["url"], timeout=10) as http:
        yield KubeApi(box["emulator"], box["url"], http, discovery)
    if discovery.gate is not None:
        discovery.gate.set()  # a request still held would keep kmock's loop from closing
    box["loop"].call_soon_threadsafe(box["stop"].set)
    thread.join(10)


@dataclass
class JobNats:
    """A job's own NATS as the operator made it: a real nats-server running the configuration of the job's
    `<job>-nats-config` Secret with its credentials Secret's TLS files, on a loopback port fixed before the
    operator starts (its RLBOOST_OPERATOR_NATS_URL). Only where it listens and stores is changed."""

    port: int
    root: Path
    server: NatsServer | None = None
    credentials: dict[str, bytes] | None = None
    host: str = ""

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, api: KubeApi, namespace: str, job: str) -> None:
        from rlboost_operator import children

        config_secret = wait_until(
            lambda: api.get("Secret", namespace, f"{job}-nats-config"), timeout=20, what="the job's NATS configuration"
        )
        secret = wait_until(lambda: api.get("Secret", namespace, f"{job}-credentials"), what="the credentials")
        self.credentials, self.host = children.secret_items(secret), children.nats_host(job, namespace)
        files = self.root / job / "credentials"
        files.mkdir(parents=True)
        for name, data in self.credentials.items():
            (files / name).write_bytes(data)
        config = json.loads(children.secret_items(config_secret)["nats.conf"])
        config.pop("http_port")
        config["listen"], config["jetstream"]["store_dir"] = f"127.0.0.1:{self.port}", str(self.root / job / "js")
        config["tls"] = {**config["tls"], **{k: str(files / Path(config["tls"][k]).name) for k in TLS_FILES}}
        self.server = NatsServer(self.root / job, port=self.port, config=json.dumps(config)).start()

    def options(self, user: str) -> dict[str, Any]:
        """nats.connect arguments of `user` of the started job (TLS checked against the job's Service name)."""
        from rlboost.auth.nats import client_options

        assert self.credentials is not None, "start() first"
        password = self.credentials[f"nats-{user}.pass"].decode()
        return client_options(user, password, self.credentials["ca.crt"], tls_hostname=self.host)


TLS_FILES = ("cert_file", "key_file", "ca_file")


@pytest.fixture
def job_nats(tmp_path: Path) -> Iterator[JobNats]:
    nats = JobNats(free_port(), tmp_path / "job-nats")
    yield nats
    if nats.server is not None:
        nats.server.stop()


@pytest.fixture
def operator(kube_api: KubeApi, job_nats: JobNats, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    """The operator (kopf, standalone, cluster-wide) running against kube_api; each job's NATS is job_nats."""
    from kopf.testing import KopfRunner

    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", job_nats.url)
    monkeypatch.setenv("RLBOOST_OPERATOR_MAX_TRAINER_RANKS", "8")
    args = ["run", "-A", "--standalone", "-m", "rlboost_operator.handlers"]
    with KopfRunner(args, timeout=30) as runner:
        for plural in ("rljobs", "nodes", "pods"):
            wait_until(lambda p=plural: kube_api.watched(p), timeout=20, what=f"the operator's watch on {plural}")
        yield kube_api
    assert runner.exception is None, runner.output
