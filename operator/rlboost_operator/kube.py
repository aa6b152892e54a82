"""A small async Kubernetes client over aiohttp, authenticated with kopf's own login result.

Just what the operator needs: get, create, replace (PUT, for the leader Lease), merge-patch (object or
/status), create-or-patch, and GET of a path outside the resources (the service-account issuer's OIDC discovery).
The credentials come from `kopf.login_with_service_account` / `kopf.login_with_kubeconfig`
(captured by the login handler), so kopf and this client always talk to the same API server.
Every call has a deadline (REQUEST_TIMEOUT_S).
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from typing import Any

import aiohttp
import kopf

# kind -> (API prefix, plural). Namespaced only.
RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "RLJob": ("/apis/rlboost.io/v1alpha1", "rljobs"),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Workload": ("/apis/kueue.x-k8s.io/v1beta2", "workloads"),  # Kueue's unit of admission (kueue.py)
}
# kind -> (API prefix, plural). Cluster-scoped ones the operator reads.
CLUSTER_RESOURCES: dict[str, tuple[str, str]] = {
    "ResourceFlavor": ("/apis/kueue.x-k8s.io/v1beta2", "resourceflavors"),
    "WorkloadPriorityClass": ("/apis/kueue.x-k8s.io/v1beta2", "workloadpriorityclasses"),
}


# One API call's deadline (aiohttp's default is 5 min): a call the API server never answers must not hold a
# reconcile (nor the cluster-keys lock every reconcile shares) for minutes; it fails, and kopf retries the reconcile.
REQUEST_TIMEOUT_S = 30.0


class KubeError(RuntimeError):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {text[:300]}")
        self.status = status


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if info.insecure:
        return False
    ctx = ssl.create_default_context(cafile=str(info.ca_path) if info.ca_path else None)
    if info.ca_data:
        data = info.ca_data
        ctx.load_verify_locations(cadata=(base64.b64decode(data) if isinstance(data, str) else data).decode())
    cert, key = info.certificate_path, info.private_key_path
    if info.certificate_data and info.private_key_data:
        # ssl wants files; the kubeconfig gave inline base64 data.
        cert_file = tempfile.NamedTemporaryFile(delete=False, suffix=".crt")  # noqa: SIM115
        key_file = tempfile.NamedTemporaryFile(delete=False, suffix=".key")  # noqa: SIM115
        cert_file.write(base64.b64decode(info.certificate_data))
        key_file.write(base64.b64decode(info.private_key_data))
        cert_file.close(), key_file.close()
        cert, key = cert_file.name, key_file.name
    if cert and key:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def discover_connection() -> kopf.ConnectionInfo | None:
    """Credentials found as the login handler finds them (service account, else kubeconfig), before kopf runs."""
    settings = kopf.OperatorSettings()
    return kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)


class Kube:
    """One aiohttp session against the API server described by a kopf ConnectionInfo."""

    def __init__(self, info: kopf.ConnectionInfo, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        headers = {"Accept": "application/json"}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        auth = aiohttp.BasicAuth(info.username, info.password or "") if info.username else None
        self.server, self.request_timeout_s = info.server.rstrip("/"), request_timeout_s
        self._session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            connector=aiohttp.TCPConnector(ssl=_ssl_context(info)),
            timeout=aiohttp.ClientTimeout(total=request_timeout_s),
        )

    async def close(self) -> None:
        await self._session.close()

    def url(self, kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        prefix, plural = RESOURCES[kind]
        path = f"{self.server}{prefix}/namespaces/{namespace}/{plural}"
        if name:
            path += f"/{name}"
        if sub:
            path += f"/{sub}"
        return path

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None = None, ctype: str = "application/json"
    ) -> dict[str, Any] | None:
        headers = {"Content-Type": ctype} if body is not None else {}
        async with self._session.request(method, url, json=body, headers=headers) as resp:
            if resp.status == 404 and method == "GET":
                return None
            if resp.status >= 300:
                raise KubeError(resp.status, await resp.text())
            return await resp.json(content_type=None)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call("GET", self.url(kind, namespace, name))

    async def get_cluster(self, kind: str, name: str) -> dict[str, Any] | None:
        """A cluster-scoped object of CLUSTER_RESOURCES; None on 404."""
        prefix, plural = CLUSTER_RESOURCES[kind]
        return await self._call("GET", f"{self.server}{prefix}/{plural}/{name}")

    async def get_path(self, path: str) -> Any:
        """GET a path of the API server that is no resource (e.g. /openid/v1/jwks); None on 404."""
        return await self._call("GET", f"{self.server}{path}")

    async def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        return await self._call("POST", self.url(obj["kind"], meta["namespace"]), obj)

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """PUT the whole object; with metadata.resourceVersion set, a stale write is answered 409."""
        meta = obj["metadata"]
        return await self._call("PUT", self.url(obj["kind"], meta["namespace"], meta["name"]), obj)

    async def patch(
        self, kind: str, namespace: str, name: str, body: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any] | None:
        return await self._call("PATCH", self.url(kind, namespace, name, sub), body, "application/merge-patch+json")

    async def apply(self, obj: dict[str, Any]) -> str:
        """Create the object, or merge-patch the existing one; returns 'created' or 'patched'."""
        meta = obj["metadata"]
        if await self.get(obj["kind"], meta["namespace"], meta["name"]) is None:
            await self.create(obj)
            return "created"
        await self.patch(obj["kind"], meta["namespace"], meta["name"], obj)
        return "patched"
