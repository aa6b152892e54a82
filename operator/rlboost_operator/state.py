"""The operator's in-memory view: settings, API client, NATS link, nodes, job pods, spot asks, known jobs, their
status subscriptions and their trainers' failures.

Filled by the kopf handlers from their watch streams; everything here is rebuilt on restart
(kopf re-lists every watched object at start). Nothing per job lives in kopf itself (no daemon, no timer):
kopf would put a finalizer on every RLJob for them, and an RLJob would hang in Terminating without an operator.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rlboost.spec import JobSpec
from rlboost_operator.config import OperatorSettings
from rlboost_operator.kube import Kube
from rlboost_operator.notices import NatsLink
from rlboost_operator.spot_ask import SpotAsk, SpotPod


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


@dataclass
class State:
    settings: OperatorSettings
    kube: Kube | None = None
    nats: dict[tuple[str, str], NatsLink] = field(default_factory=dict)  # (ns, job) -> the link to its NATS
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)  # (ns, pod) -> (job, node)
    jobs: dict[tuple[str, str], JobRef] = field(default_factory=dict)
    notified: set[tuple[str, str]] = field(default_factory=set)  # (node, reason) already announced
    status_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    subscriptions: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # (ns, job) -> its NATS subs
    followers: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)  # (ns, job) -> subscribing
    trainer_failures: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)  # (ns, pod) -> (job, n)
    background: asyncio.Task[None] | None = None  # the operator-wide rescale loop
    identity_refresh: asyncio.Task[None] | None = None  # the loop that keeps the jobs' worker-identity.json current
    spot_pods: dict[tuple[str, str], tuple[str, SpotPod]] = field(default_factory=dict)  # (ns, pod) -> (job, pod)
    spot_asks: dict[tuple[str, str], SpotAsk] = field(default_factory=dict)  # (ns, job) -> its autoscaler state
    spot_rechecks: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)  # (ns, job) -> timer
    spot_targets: dict[tuple[str, str], int] = field(default_factory=dict)  # (ns, job) -> busy sizing's target
    # the cluster's service-account keys and when they were read (monotonic): reconciles within identity_refresh_s
    # of a read reuse them, so the API server is asked once per period, not twice per reconcile
    cluster_keys: tuple[float, Any] | None = None
    cluster_keys_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one read at a time, shared by waiters

    def reset(self) -> None:
        """Forget everything seen (a fresh start: kopf lists every object again)."""
        for seen in (
            self.nodes,
            self.pods,
            self.jobs,
            self.notified,
            self.status_locks,
            self.spot_pods,
            self.spot_asks,
            self.spot_targets,
            self.followers,
        ):
            seen.clear()
        self.subscriptions.clear(), self.trainer_failures.clear()
        self.cluster_keys, self.cluster_keys_lock = None, asyncio.Lock()  # a lock of this run's event loop

    def spot_pods_of(self, namespace: str, job: str) -> list[SpotPod]:
        """The job's live spot worker pods."""
        return [pod for (ns, _), (j, pod) in self.spot_pods.items() if ns == namespace and j == job]

    def most_trainer_failures(self, namespace: str, job: str) -> int:
        """The most failures any of the job's trainer ranks had (ranks die together; a sum would count one
        failure once per rank)."""
        counts = [n for (ns, _), (j, n) in self.trainer_failures.items() if ns == namespace and j == job]
        return max(counts, default=0)

    def pods_on(self, node: str) -> dict[tuple[str, str], list[str]]:
        """The job pods on a node, grouped by (namespace, job)."""
        out: dict[tuple[str, str], list[str]] = {}
        for (ns, pod), (job, where) in sorted(self.pods.items()):
            if where == node:
                out.setdefault((ns, job), []).append(pod)
        return out
