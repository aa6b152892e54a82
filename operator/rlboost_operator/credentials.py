"""A job's credentials and its workers' identity.

- The job's credentials Secret (rlboost.auth.credentials) and its NATS configuration Secret: made once, never
  rewritten (running pods hold them); an item added to rlboost since a job's were made is added to its Secret.
  With them, the operator's link to the job's NATS, as its user `operator`.
- worker-identity.json, the one item the operator keeps current: the cluster's service-account issuer and keys
  (cluster_keys.py), which the job's manager checks each worker's projected token against. A job without it gets no
  children (its manager would refuse every worker). `WorkerIdentity` (in kopf's memo) owns the keys as last read,
  re-reads them every identity_refresh_s and rewrites each running job's item when they changed (a key rotation).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import kopf

from rlboost.auth.credentials import WORKER_IDENTITY_CLUSTER, added_items, generate_items
from rlboost_operator import children, cluster_keys, status
from rlboost_operator.config import OperatorSettings
from rlboost_operator.kube import Kube, KubeError
from rlboost_operator.metrics import ERRORS
from rlboost_operator.shared import JobLinks, Jobs, KubeLogin

log = logging.getLogger(__name__)
IDENTITY_READY = "the manager has the cluster's service-account keys to check its workers' identities"
IDENTITY_RETRY_S = 30  # unreadable service-account keys (a new job cannot start without them) are tried again


async def ensure_credentials(
    kube: Kube, links: JobLinks, namespace: str, job: str, body: kopf.Body
) -> dict[str, bytes]:
    """The job's credentials and its NATS configuration: made once, never rewritten (running pods hold them; only
    the operator's own item worker-identity.json follows the cluster's keys); and the operator's link to the job's
    NATS, as its user `operator`. Returns the credentials' items."""
    n = children.names(job)
    found = await kube.get("Secret", namespace, n["credentials"])
    if found is None:
        items = generate_items(children.tls_hosts(job, namespace))
        await create_adopted(kube, children.credentials_secret(job, namespace, items), body)
    else:
        items = children.secret_items(found)
        if added := added_items(items):  # made before these items existed: add them, keep the rest
            patch = children.credentials_secret(job, namespace, added)
            await kube.patch("Secret", namespace, n["credentials"], {"data": patch["data"]})
            items |= added
    if await kube.get("Secret", namespace, n["nats_config"]) is None:
        await create_adopted(kube, children.nats_config_secret(job, namespace, items), body)
    links.ensure(namespace, job, items)
    return items


async def create_adopted(kube: Kube, obj: dict[str, Any], body: kopf.Body) -> None:
    kopf.adopt(obj, owner=body)
    await kube.create(obj)


async def read_cluster_keys(kube: Kube) -> cluster_keys.ClusterKeys:
    """The API server's service-account issuer and signing keys, read now; an unusable answer, or none within the
    request deadline, is a DiscoveryError naming the endpoint."""
    answers = []
    for path in (cluster_keys.ISSUER_PATH, cluster_keys.JWKS_PATH):
        try:
            answers.append(await kube.get_path(path))
        except TimeoutError as err:
            raise cluster_keys.DiscoveryError(path, f"no answer within {kube.request_timeout_s:g} s") from err
        except (KubeError, aiohttp.ClientError, ValueError) as err:
            raise cluster_keys.DiscoveryError(path, str(err)) from err
    return cluster_keys.parse_discovery(*answers)


class WorkerIdentity:
    """Keeps the cluster's service-account keys in each job's credentials (worker-identity.json). Owns: the keys as
    last read and when (monotonic: reconciles within identity_refresh_s of a read reuse them, so the API server is
    asked once per period, not twice per reconcile), and the lock that lets reconciles starting together share
    one read."""

    def __init__(self, api: KubeLogin, settings: OperatorSettings, jobs: Jobs) -> None:
        self.api, self.settings, self.jobs = api, settings, jobs
        self._read: tuple[float, cluster_keys.ClusterKeys] | None = None
        self._lock = asyncio.Lock()  # made in the operator's event loop (startup), one read at a time

    async def keys(self, fresh: bool = False) -> cluster_keys.ClusterKeys:
        """The API server's service-account issuer and signing keys (cluster_keys.py: why every service account,
        the operator's included, may read them): those read within identity_refresh_s unless `fresh` (the refresh
        loop's read, which is what brings a key rotation)."""
        asked = time.monotonic()
        async with self._lock:  # reconciles that start together share the read the first one makes
            cached = self._read
            read_since = cached is not None and cached[0] >= asked  # by a reconcile that held the lock before us
            recent = cached is not None and asked - cached[0] < self.settings.identity_refresh_s
            if cached is not None and (read_since or (recent and not fresh)):
                return cached[1]
            keys = await read_cluster_keys(self.api.client())
            self._read = (time.monotonic(), keys)
            return keys

    async def ensure(self, body: kopf.Body, items: dict[str, bytes], ended: bool) -> bool:
        """The cluster's keys in the job's credentials (worker-identity.json), up to date; True when it is there. A
        job without it gets no children (its manager would refuse every worker): the failure goes into the status
        (WorkerIdentityReady False, naming the endpoint and the fix) and the reconcile is retried. A job that has it
        keeps running on it through a failed re-read; an ended job needs none."""
        namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
        present = items.get(WORKER_IDENTITY_CLUSTER)
        try:
            keys = await self.keys()
        except cluster_keys.DiscoveryError as err:
            if present is not None or ended:
                log.warning("cannot re-read the cluster's service-account keys", extra={"job": job, "error": str(err)})
                return present is not None
            await self._write_failure(body, str(err))
            raise kopf.TemporaryError(str(err), delay=IDENTITY_RETRY_S) from None
        item = cluster_keys.identity_item(job, namespace, keys)
        if await self._write_item(namespace, job, item, present):
            items[WORKER_IDENTITY_CLUSTER] = item
        return True

    async def _write_item(self, namespace: str, job: str, item: bytes, present: bytes | None) -> bool:
        """Write the job's worker-identity.json when it differs from what its Secret holds; True if written."""
        if item == present:
            return False
        patch = children.credentials_secret(job, namespace, {WORKER_IDENTITY_CLUSTER: item})
        await self.api.client().patch("Secret", namespace, children.names(job)["credentials"], {"data": patch["data"]})
        log.info("wrote the cluster's service-account keys", extra={"job": job, "namespace": namespace})
        return True

    async def _write_failure(self, body: kopf.Body, message: str) -> None:
        """WorkerIdentityReady False and a Warning Event, unless the status says so already. Called with the job's
        status lock held."""
        namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
        kube = self.api.client()
        current = await kube.get("RLJob", namespace, job) or {}
        previous = current.get("status") or {}
        if any(
            c.get("type") == cluster_keys.CONDITION and c.get("message") == message
            for c in previous.get("conditions") or []
        ):
            return
        patch = status.worker_identity_status(
            previous, False, "IssuerDiscoveryFailed", message, status.generation(current)
        )
        await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
        kopf.warn(body, reason="IssuerDiscoveryFailed", message=message)

    async def refresh(self) -> None:
        """Each running job's worker-identity.json, rewritten where the cluster's keys changed."""
        if not self.jobs:
            return
        keys = await self.keys(fresh=True)
        for ref in self.jobs.running():
            namespace, job = ref.namespace, ref.name
            secret = await self.api.client().get("Secret", namespace, children.names(job)["credentials"])
            if secret is not None:
                present = children.secret_items(secret).get(WORKER_IDENTITY_CLUSTER)
                await self._write_item(namespace, job, cluster_keys.identity_item(job, namespace, keys), present)

    async def run(self) -> None:
        """Re-read the cluster's service-account keys every identity_refresh_s and rewrite each running job's
        worker-identity.json that they changed (a key rotation; the manager re-reads the file). One loop for all
        jobs, as the rescale loop, so no RLJob gets a finalizer."""
        while True:
            await asyncio.sleep(self.settings.identity_refresh_s)
            try:
                await self.refresh()
            except Exception:
                ERRORS.labels("identity").inc()
                log.exception("refreshing the cluster's service-account keys failed; trying again next period")
