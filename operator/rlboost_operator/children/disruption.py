"""Protection of a job's single-replica services from voluntary disruption (issue 29): a PodDisruptionBudget each
for the trainer (every rank), the rollout-manager and the weight-server that allows no eviction, and on their pods the
annotations that keep Karpenter (`karpenter.sh/do-not-disrupt`) and the cluster autoscaler
(`cluster-autoscaler.kubernetes.io/safe-to-evict`) from consolidating their nodes away. A drain of such a node waits
for the job to end (or for someone to delete the pod); a pod that is not Ready may still be evicted
(unhealthyPodEvictionPolicy AlwaysAllow), so a crash-looping pod never blocks a node upgrade. Rollout workers have
none: a worker's loss is a preemption, which the manager absorbs."""

from __future__ import annotations

from typing import Any

from rlboost_operator.children.naming import labels, names, selector
from rlboost_operator.children.pod import meta

DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
# component label -> the key of its workload in names()
PROTECTED = {"trainer": "trainer", "rollout-manager": "manager", "weight-server": "weights"}


def disruption_budgets(job: str, namespace: str) -> list[dict[str, Any]]:
    """A PodDisruptionBudget allowing no voluntary eviction of each protected component's pods."""
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": meta(names(job)[key], namespace, labels(job, component)),
            "spec": {
                "maxUnavailable": 0,
                "selector": {"matchLabels": selector(job, component)},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
        for component, key in PROTECTED.items()
    ]
