"""The watch of Kueue's Workloads (registered only with the operator's `kueue` setting on: handlers.py): when Kueue
admits, evicts or requeues the Workload of an RLJob, the RLJob is reconciled (lifecycle.py), which resumes, suspends
or keeps holding it."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from rlboost_operator import lifecycle
from rlboost_operator.queueing import Queueing
from rlboost_operator.shared import KubeLogin

log = logging.getLogger(__name__)
WORKLOADS = ("kueue.x-k8s.io", "v1beta2", "workloads")


@kopf.on.event(*WORKLOADS, labels={"rlboost.io/job": kopf.PRESENT})
async def workload_event(
    event: dict[str, Any], body: kopf.Body, namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    """Kueue's decision on a job's Workload changed (or the Workload went): reconcile its RLJob."""
    queueing: Queueing = memo.queueing
    if event.get("type") != "DELETED" and not queueing.changed(namespace, dict(body)):
        return
    job = labels["rlboost.io/job"]
    api: KubeLogin = memo.api
    rljob = await api.client().get("RLJob", namespace, job)
    if rljob is None or ((rljob.get("status") or {}).get("kueue") or {}).get("workload") != body.metadata.name:
        return  # gone, or an older Workload of the job (deactivated)
    try:
        await lifecycle.reconcile(memo, kopf.Body(rljob), rljob.get("spec"))
    except (kopf.PermanentError, kopf.TemporaryError) as err:  # the RLJob's own handlers retry it
        log.warning("reconciling after a Workload change failed", extra={"job": job, "error": str(err)})
