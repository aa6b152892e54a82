"""The operator's watches of nodes and job pods: one kopf handler each, passing every event to each concern in
a fixed order. (kopf would call several handlers of one resource in the order their modules happened to be
imported; the order matters: a pod whose model fetch failed ends its job before the spot sizing would rescale
it, and a node going away is announced before the spot Deployments are rescaled.)"""

from __future__ import annotations

from typing import Any

import kopf

from rlboost_operator import lifecycle, model_source
from rlboost_operator.preemption import PreemptionNotices
from rlboost_operator.shared import JOB_POD_LABELS, Nodes
from rlboost_operator.sizing import SpotSizer, count_spot_nodes


@kopf.on.event("", "v1", "nodes")
async def node_event(event: dict[str, Any], body: kopf.Body, name: str, memo: kopf.Memo, **_: Any) -> None:
    """A node came, changed or went: announce it if going away, count the spot nodes, rescale every job."""
    deleted, node = event.get("type") == "DELETED", dict(body)
    nodes: Nodes = memo.nodes
    nodes.observe(name, node, deleted)
    notices: PreemptionNotices = memo.notices
    await notices.node_changed(name, node, deleted)
    count_spot_nodes(nodes)
    sizer: SpotSizer = memo.sizer
    await sizer.rescale_all()


@kopf.on.event("", "v1", "pods", labels=JOB_POD_LABELS)
async def pod_event(
    event: dict[str, Any], body: kopf.Body, namespace: str, name: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """A job pod changed: its model fetch or its trainer may end the job, a spot worker moves the spot ask, and a
    pod on a node going away is announced."""
    deleted, job = event.get("type") == "DELETED", labels["rlboost.io/job"]
    problem = model_source.fetch_failure(body) if not deleted else None
    if problem is not None:
        await lifecycle.fetch_failed(memo, namespace, job, name, problem)
    await lifecycle.watch_trainer(memo, event, body, namespace, name, labels)
    sizer: SpotSizer = memo.sizer
    if sizer.track_pod(deleted, dict(body), namespace, name, job):
        await sizer.rescale_known(namespace, job)
    notices: PreemptionNotices = memo.notices
    await notices.pod_changed(namespace, name, job, None if deleted else body.get("spec", {}).get("nodeName"))
