"""The end of a job (its trainer's `done`, trainer.backoffLimit exceeded, a model fetch that gave up): its workloads
written to its status (how it ended, and that it stopped), then its workloads scaled to zero, and Events posted. Its
PVCs, Secrets, ConfigMap and status are kept, and every later reconcile keeps it at zero (lifecycle.py)."""

from __future__ import annotations

from typing import Any

import kopf

from rlboost_operator import children, status
from rlboost_operator.kube import Kube, KubeError
from rlboost_operator.sizing import SpotSizer


async def end_job(
    kube: Kube,
    sizer: SpotSizer,
    current: dict[str, Any],
    outcome: dict[str, Any],
    reason: str,
    event: tuple[str, str],
    ok: bool,
) -> None:
    """A job ended: write how it ended and that it stopped, then scale its workloads to zero, and post Events.
    Called with the job's status lock held. The status first: it is the record of the end, and a finished status
    is what every later reconcile keeps at zero (lifecycle.py), so an operator killed between the two writes
    leaves a job that ends at zero once the next leader reconciles it. Scaling first had left, in the cluster
    lane's chaos, a job at zero whose status still said Running: nothing would publish `done` again."""
    meta = current.get("metadata") or {}
    namespace, job = meta.get("namespace") or "default", meta.get("name") or ""
    sizer.drop(namespace, job)  # no more spot rescaling
    previous, generation = current.get("status") or {}, status.generation(current)
    patch = {**outcome, **status.stopped_status({**previous, **outcome}, reason, generation=generation)}
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    await scale_to_zero(kube, namespace, job, rljob_variants(current))
    target = {"apiVersion": "rlboost.io/v1alpha1", "kind": "RLJob", "metadata": meta}
    (kopf.info if ok else kopf.warn)(target, reason=event[0], message=event[1])
    kopf.info(target, reason="ScaledToZero", message=patch["conditions"][-1]["message"])


async def scale_to_zero(kube: Kube, namespace: str, job: str, variants: list[str]) -> None:
    """Every workload of the job (`variants`: its spot variants') at zero replicas (a child already gone is fine)."""
    for kind, name in children.workloads(job, variants, env_runners=True):  # a job without them: 404, fine
        await patch_if_present(kube, kind, namespace, name, {"spec": {"replicas": 0}})


async def patch_if_present(
    kube: Kube, kind: str, namespace: str, name: str, body: dict[str, Any], sub: str | None = None
) -> None:
    try:
        await kube.patch(kind, namespace, name, body, sub=sub)
    except KubeError as err:
        if err.status != 404:
            raise


def status_variants(workers_status: dict[str, Any] | None) -> list[str]:
    """The spot variants status.workers.spotSplit names (what the operator last asked for)."""
    split = (workers_status or {}).get("spotSplit") or []
    return [item["name"] for item in split if isinstance(item, dict) and isinstance(item.get("name"), str)]


def rljob_variants(rljob: dict[str, Any]) -> list[str]:
    """Every spot variant an RLJob (as read) may have a Deployment of: its spec's and its status's."""
    spot_spec = ((rljob.get("spec") or {}).get("rollout") or {}).get("spot") or {}
    declared = [v["name"] for v in spot_spec.get("variants") or [] if isinstance(v, dict) and "name" in v]
    return [*declared, *status_variants((rljob.get("status") or {}).get("workers"))]
