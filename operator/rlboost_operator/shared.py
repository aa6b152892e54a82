"""What the operator's concerns share through kopf's memo (startup.py puts one of each there): the API client
kopf's login made, the running jobs with one status lock each, the nodes seen, and the link to each job's NATS.

Everything here is rebuilt on restart (kopf re-lists every watched object at start, and each run has a fresh
memo). Nothing per job lives in kopf itself (no daemon, no timer): kopf would put a finalizer on every RLJob for
them, and an RLJob would hang in Terminating without an operator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import kopf

from rlboost.auth.credentials import CA_CERT
from rlboost.auth.nats import client_options
from rlboost.spec import JobSpec
from rlboost_operator import children, spot
from rlboost_operator.config import OperatorSettings
from rlboost_operator.kube import Kube
from rlboost_operator.notices import NatsLink

JobKey = tuple[str, str]  # (namespace, RLJob name)
RLJOB = ("rlboost.io", "v1alpha1", "rljobs")
JOB_POD_LABELS = {"rlboost.io/job": kopf.PRESENT}  # the pods of any RLJob


class KubeLogin:
    """The operator's Kubernetes client, made from kopf's newest login (a re-login, after a 401, replaces it), so
    that kopf and this client always talk to the same API server as the same user."""

    def __init__(self) -> None:
        self._kube: Kube | None = None

    def login(self, info: kopf.ConnectionInfo) -> None:
        self._kube = Kube(info)

    def client(self) -> Kube:
        """The client; a handler that runs before the login is retried (kopf logs in before it watches)."""
        if self._kube is None:
            raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=1)
        return self._kube

    async def close(self) -> None:
        if self._kube is not None:
            await self._kube.close()


@dataclass
class JobRef:
    """A valid RLJob the operator reconciled: enough to scale it and post Events on it."""

    namespace: str
    name: str
    uid: str
    spec: JobSpec
    spot_replicas: int | None = None  # last value written to the spot Deployment
    spot_reason: str | None = None  # why (spot_ask's decision reason), for an Event when it changes
    spot_ask: dict[str, Any] | None = None  # the autoscaler state last written to status.workers.spotAsk
    spot_target: int | None = None  # busy sizing: the target last written to status.workers.spotTarget
    spot_split: dict[str, int] | None = None  # a spot pool with variants: the ask per variant last written

    def body(self) -> dict[str, Any]:
        """A minimal object reference for kopf.event()."""
        meta = {"name": self.name, "namespace": self.namespace, "uid": self.uid}
        return {"apiVersion": "rlboost.io/v1alpha1", "kind": "RLJob", "metadata": meta}


class Jobs:
    """The running RLJobs (valid, reconciled, not ended): what is rescaled, and whose spec a step report is judged
    by; and one status lock per job, so that a step report never overwrites a later `done`."""

    def __init__(self) -> None:
        self._refs: dict[JobKey, JobRef] = {}
        self._status_locks: dict[JobKey, asyncio.Lock] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._refs

    def __bool__(self) -> bool:
        return bool(self._refs)

    def get(self, namespace: str, job: str) -> JobRef | None:
        return self._refs.get((namespace, job))

    def running(self) -> list[JobRef]:
        """A copy: the caller may await between items while jobs come and go."""
        return list(self._refs.values())

    def put(self, ref: JobRef) -> JobRef | None:
        """Keep `ref` as the job's; returns the one it replaced."""
        known = self._refs.get((ref.namespace, ref.name))
        self._refs[(ref.namespace, ref.name)] = ref
        return known

    def pop(self, namespace: str, job: str) -> JobRef | None:
        return self._refs.pop((namespace, job), None)

    def status_lock(self, namespace: str, job: str) -> asyncio.Lock:
        """One status writer per job at a time: a step report must not overwrite a later 'done'."""
        return self._status_locks.setdefault((namespace, job), asyncio.Lock())

    def forget_status_lock(self, namespace: str, job: str) -> None:
        self._status_locks.pop((namespace, job), None)


class Nodes:
    """The cluster's nodes as last seen (labels, taints, conditions, allocatable accelerators)."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, Any]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def observe(self, name: str, node: dict[str, Any], deleted: bool) -> None:
        """A node's watch event (watches.node_event)."""
        if deleted:
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = node

    def get(self, name: str) -> dict[str, Any]:
        return self._nodes.get(name, {})

    def values(self) -> Iterable[dict[str, Any]]:
        return self._nodes.values()

    def doomed(self) -> set[str]:
        """The nodes going away (a preemption signal: a termination taint, NotReady, cordoned)."""
        return {name for name, node in self._nodes.items() if spot.preemption(node) is not None}


class JobLinks:
    """The operator's link to each job's own NATS, as its user `operator`: made once the job's credentials exist
    (credentials.py), used to publish preemption notices and to follow the job's status, closed when the RLJob
    goes."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self._links: dict[JobKey, NatsLink] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._links

    def get(self, namespace: str, job: str) -> NatsLink | None:
        return self._links.get((namespace, job))

    def ensure(self, namespace: str, job: str, credentials: dict[str, bytes]) -> None:
        """The job's link, made unless there is one: to its NATS Service, or the operator's nats_url template; TLS
        checked against the Service's name."""
        if (namespace, job) in self._links:
            return
        template = self.settings.nats_url
        url = template.format(job=job, namespace=namespace) if template else children.nats_url(job, namespace)
        password, ca = children.operator_nats_password(credentials), credentials.get(CA_CERT)
        options = client_options("operator", password, ca, tls_hostname=children.nats_host(job, namespace))
        self._links[(namespace, job)] = NatsLink(url, options=options)

    async def close(self, namespace: str, job: str) -> None:
        link = self._links.pop((namespace, job), None)
        if link is not None:
            with contextlib.suppress(Exception):  # the connection may be gone
                await link.close()

    async def close_all(self) -> None:
        for link in self._links.values():
            await link.close()
        self._links.clear()
