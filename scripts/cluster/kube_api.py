"""The cluster lane's Kubernetes API server: kmock's emulator as a long-running process.

    python scripts/cluster/kube_api.py --host 10.213.0.1 --port 6443 --ready-file /tmp/x/api.url \
        --signing-key /tmp/x/sa-signing.key

What it adds to kmock's in-memory emulator (which stores objects, merges patches as plain dicts,
replays every object on each watch and ignores resourceVersion):
- the built-in resources the operator, kopf and the podlet use, with their `status` subresources;
- CustomResourceDefinitions that register their resource when created (`kubectl apply -f crd.yaml`
  then serves `rlboost.io/v1alpha1/rljobs`), as a real API server does;
- `metadata.generateName` (kopf posts Events that way), a uid and a creationTimestamp on create, and a
  resourceVersion that every write moves on (kopf's JSON patches test it);
- the service-account issuer's OIDC discovery (`/.well-known/openid-configuration`, `/openid/v1/jwks`) for the
  key in --signing-key (made if missing), with which the podlet signs pods' projected tokens (sa_tokens.py:
  where the stand-in begins; a real API server signs them through the TokenRequest API).
- PUT (replace) with the API server's optimistic concurrency: a stale resourceVersion is answered 409 Conflict (the
  operator's replicas elect their leader on a Lease that way).
What it does not do: authentication, admission (CEL rules), resourceVersion conflicts on merge patches, label
selectors on list/watch, garbage collection of owned objects. The podlet stands in for the
controllers and the kubelet (scripts/cluster/podlet.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kmock
import sa_tokens
from aiohttp import web

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}
KEEP_REQUESTS = 8  # of the requests kmock records (LaneEmulator.forget_old_requests): each is scanned per request
BUILTIN: dict[str, dict[str, Any]] = {
    "v1/namespaces": dict(kind="Namespace", namespaced=False),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(kind="CustomResourceDefinition", namespaced=False),
    "v1/nodes": dict(kind="Node", namespaced=False, subresources={"status"}),
    "v1/pods": dict(kind="Pod", namespaced=True, subresources={"status"}),
    "v1/events": dict(kind="Event", namespaced=True),
    "events.k8s.io/v1/events": dict(kind="Event", namespaced=True),
    "v1/configmaps": dict(kind="ConfigMap", namespaced=True),
    "v1/secrets": dict(kind="Secret", namespaced=True),
    "v1/services": dict(kind="Service", namespaced=True),
    "v1/serviceaccounts": dict(kind="ServiceAccount", namespaced=True),
    "v1/persistentvolumeclaims": dict(kind="PersistentVolumeClaim", namespaced=True, subresources={"status"}),
    "apps/v1/deployments": dict(kind="Deployment", namespaced=True, subresources={"status", "scale"}),
    "apps/v1/statefulsets": dict(kind="StatefulSet", namespaced=True, subresources={"status", "scale"}),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", namespaced=True),
    "policy/v1/poddisruptionbudgets": dict(kind="PodDisruptionBudget", namespaced=True),  # a job's budgets
    # a platform team's job names a PriorityClass (the podlet admits a pod only when its class exists)
    "scheduling.k8s.io/v1/priorityclasses": dict(kind="PriorityClass", namespaced=False),
    # stored for the operator; the podlet enforces no NetworkPolicy (every lane container shares one network)
    "networking.k8s.io/v1/networkpolicies": dict(kind="NetworkPolicy", namespaced=True),
}


def crd_resources(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The `group/version/plural` keys a CustomResourceDefinition serves, with their ResourceInfo arguments."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out: dict[str, dict[str, Any]] = {}
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        info: dict[str, Any] = dict(kind=names.get("kind"), namespaced=spec.get("scope") == "Namespaced")
        if "status" in (version.get("subresources") or {}):
            info["subresources"] = {"status"}
        out[f"{spec.get('group')}/{version['name']}/{names.get('plural')}"] = info
    return out


class LaneEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus generateName, uid/creationTimestamp, resourceVersion and CRD registration.

    Every write gets a new resourceVersion, as on a real API server: kopf's JSON patches test it (a patch
    whose `test` op names an older version fails, as it would there)."""

    versions = itertools.count(1)
    discovery: dict[str, Any] = {}  # path -> the OIDC discovery document served there

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        self.forget_old_requests()
        if request.method == kmock.method.GET and request.url.path in self.discovery:
            return web.json_response(self.discovery[request.url.path])
        if request.method == kmock.method.PUT and request.name is not None and isinstance(request.data, dict):
            return await self._replace(request)
        data = request.data
        if request.action == kmock.action.UPDATE and request.name is not None:
            version = str(next(self.versions))
            if isinstance(data, list):  # JSON patch: its test ops see the old version, then it moves on
                data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            elif isinstance(data, dict):
                data.setdefault("metadata", {})["resourceVersion"] = version
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = str(next(self.versions))
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:8]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            if data.get("kind") == "CustomResourceDefinition":
                register(self, crd_resources(data))
        return await super()._handle(request)

    async def _replace(self, request):  # type: ignore[no-untyped-def]
        return await replace(self, request, lambda: str(next(self.versions)))

    def forget_old_requests(self) -> None:
        """kmock keeps every request it served (a test asserts on them) and finds each new request's reaction by
        scanning them all: over a lane run of tens of thousands of requests every call took 3-5 s, /version
        included, with this process at 90% of a core (the Kueue run's suspensions took minutes of it). The lane
        asserts on none, so only the newest are kept; the one being handled is the newest (appended just before,
        with no await between: the scan that follows still finds it)."""
        if len(self._requests) > 2 * KEEP_REQUESTS:
            del self._requests[:-KEEP_REQUESTS]
        for payload in self._payloads:
            if len(payload._requests) > 2 * KEEP_REQUESTS:
                del payload._requests[:-KEEP_REQUESTS]


async def replace(emulator: kmock.KubernetesEmulator, request: Any, version: Callable[[], str]) -> web.Response:
    """PUT (kmock has none) as the API server answers it: 404 if absent, 409 Conflict if the object's
    resourceVersion moved on since the one sent (optimistic concurrency: operator replicas racing for the leader
    Lease), else the object replaced at a new resourceVersion (`version()`). tests/rlboost_operator/conftest.py's
    emulator uses it too."""
    key = (request.resource, request.namespace, request.name)
    async with emulator._lock:
        if key not in emulator.objects or emulator.objects[key].deleted:
            return _status(404, "NotFound", f"{request.name} not found")
        current = emulator.objects[key]["metadata"].get("resourceVersion")
        sent = (request.data.get("metadata") or {}).get("resourceVersion")
        if sent is not None and sent != current:
            return _status(409, "Conflict", f"resourceVersion {sent} is stale; the object is at {current}")
        meta = {**emulator.objects[key]["metadata"], **request.data["metadata"], "resourceVersion": version()}
        new = {**request.data, "metadata": meta}
        emulator.objects[key].create(new)  # a new version in the object's history, replacing the old one
        await emulator._buses[request.resource].put({"type": "MODIFIED", "object": new})
    return web.json_response(new)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason}
    return web.json_response({**body, "message": message}, status=code)


def register(emulator: kmock.KubernetesEmulator, resources: dict[str, dict[str, Any]]) -> None:
    for key, info in resources.items():
        emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)


async def serve(host: str, port: int, ready_file: Path | None, signing_key: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with LaneEmulator() as emulator, kmock.Server(emulator, host=host, port=port) as server:
        register(emulator, BUILTIN)
        url = str(server.url).rstrip("/")
        if signing_key is not None:
            key = sa_tokens.load_or_make_key(signing_key)
            emulator.discovery = {
                "/.well-known/openid-configuration": sa_tokens.openid_configuration(url),
                "/openid/v1/jwks": sa_tokens.jwks(key),
            }
        print(f"kube-api: serving the Kubernetes API (kmock) at {url}", flush=True)
        if ready_file is not None:
            ready_file.write_text(url)
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (the lane's podman network gateway)")
    p.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    p.add_argument("--ready-file", type=Path, help="write the server's URL here once it serves")
    p.add_argument("--signing-key", type=Path, help="service-account signing key (PEM; made if missing)")
    args = p.parse_args()
    asyncio.run(serve(args.host, args.port or 0, args.ready_file, args.signing_key))


if __name__ == "__main__":
    main()
