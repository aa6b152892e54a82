"""Preemption notices: a node going away (a cloud's termination taint, NotReady, cordoned, deleted) becomes one
NATS notice per job with pods on it (rlboost.wire.events.PreemptionNotice, naming the node and the job's pods
there), and an Event on each such RLJob. `PreemptionNotices` (in kopf's memo) owns where each job pod runs and
what was announced; watches.py passes it the node and pod events."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from rlboost.wire.events import PreemptionNotice
from rlboost_operator import spot
from rlboost_operator.metrics import ERRORS, NOTICES
from rlboost_operator.shared import JobKey, JobLinks, Jobs, Nodes

log = logging.getLogger(__name__)


class PreemptionNotices:
    """Announces nodes going away to the jobs with pods on them. Owns: the node of each job pod, and the
    (node, reason) signals announced already (each once; a node that recovers may be announced again)."""

    def __init__(self, jobs: Jobs, nodes: Nodes, links: JobLinks) -> None:
        self.jobs, self.nodes, self.links = jobs, nodes, links
        self.pods: dict[JobKey, tuple[str, str]] = {}  # (ns, pod) -> (job, node)
        self.notified: set[tuple[str, str]] = set()  # (node, reason) already announced

    def pods_on(self, node: str) -> dict[JobKey, list[str]]:
        """The job pods on a node, grouped by (namespace, job)."""
        out: dict[JobKey, list[str]] = {}
        for (ns, pod), (job, where) in sorted(self.pods.items()):
            if where == node:
                out.setdefault((ns, job), []).append(pod)
        return out

    async def node_changed(self, name: str, node: dict[str, Any], deleted: bool) -> None:
        signal = spot.preemption(node, deleted=deleted)
        if signal is None:
            self.notified = {n for n in self.notified if n[0] != name}  # a recovered node may be preempted again
        else:
            await self.announce(signal)

    async def pod_changed(self, namespace: str, name: str, job: str, node: str | None) -> None:
        """A job pod's node (None: deleted, or not scheduled yet); announced at once if that node is going away."""
        if not node:
            self.pods.pop((namespace, name), None)
            return
        self.pods[(namespace, name)] = (job, node)
        signal = spot.preemption(self.nodes.get(node)) if node in self.nodes else None
        if signal is not None:  # a pod landed on a node already going away
            self.notified.discard((signal.node, signal.reason))
            await self.announce(signal)

    async def announce(self, signal: spot.Preemption) -> None:
        """Publish one notice per job with pods on the node, and post an Event on each RLJob."""
        if (signal.node, signal.reason) in self.notified:
            return
        self.notified.add((signal.node, signal.reason))
        for (namespace, job), pods in self.pods_on(signal.node).items():
            notice = PreemptionNotice(
                node=signal.node, workers=pods, reason=signal.reason, deadline_s=signal.deadline_s
            )
            try:
                link = self.links.get(namespace, job)
                if link is None:
                    raise RuntimeError("no link to the job's NATS yet: the RLJob was not reconciled")
                await link.publish_notice(namespace, job, notice)
            except Exception:
                ERRORS.labels("nats").inc()
                self.notified.discard((signal.node, signal.reason))  # try again on the node's next event
                log.exception("publishing a preemption notice failed", extra={"node": signal.node, "job": job})
                continue
            NOTICES.labels(signal.reason).inc()
            extra = {"node": signal.node, "job": job, "reason": signal.reason, "workers": pods}
            log.info("preemption notice sent", extra=extra)
            ref = self.jobs.get(namespace, job)
            if ref is not None:
                message = f"node {signal.node}: {signal.reason}; draining {', '.join(pods)}"
                kopf.info(ref.body(), reason="Preemption", message=message)
