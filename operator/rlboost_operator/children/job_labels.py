"""The RLJob's own labels on every child and every pod it runs (Kueue's `kueue.x-k8s.io/queue-name` and
`kueue.x-k8s.io/priority-class` among them), so whatever selects by labels (Kueue, cost allocation, policy engines)
sees the job's objects as the job's. A label the operator sets itself (names, components, pools: what selectors, the
PodMonitor and the watches rely on) wins over a job label of the same key.

A label changed on a running RLJob reaches the pod templates at the next reconcile, which rolls the pods (as any
template change does); the trainer resumes from its newest checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TEMPLATED = frozenset({"Deployment", "StatefulSet"})
NOT_PROPAGATED = ("kubectl.kubernetes.io/",)  # kubectl's bookkeeping is about the RLJob object itself


def job_labels(rljob_labels: Mapping[str, str] | None) -> dict[str, str]:
    """The labels of the RLJob its children get."""
    return {k: v for k, v in (rljob_labels or {}).items() if not k.startswith(NOT_PROPAGATED)}


def with_job_labels(objs: list[dict[str, Any]], labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """`objs` with `labels` on each one's metadata and on each pod template's (in place; returned for chaining)."""
    if not labels:
        return objs
    for obj in objs:
        _merge(obj["metadata"], labels)
        if obj["kind"] in TEMPLATED:
            _merge(obj["spec"]["template"].setdefault("metadata", {}), labels)
    return objs


def _merge(meta: dict[str, Any], labels: Mapping[str, str]) -> None:
    meta["labels"] = {**labels, **(meta.get("labels") or {})}
