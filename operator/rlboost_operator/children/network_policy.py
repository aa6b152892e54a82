"""The job's NetworkPolicy (unless the operator's settings turn it off): only the job's own pods reach its pods,
the operator's pods reach its NATS, and the metrics namespaces scrape its metrics ports."""

from __future__ import annotations

from typing import Any

from rlboost_operator.children.naming import METRICS_PORT, NATS_PORT, WEIGHTS_PORT, labels, names
from rlboost_operator.children.pod import meta
from rlboost_operator.config import OperatorSettings

OPERATOR_POD_LABELS = {"app.kubernetes.io/name": "rlboost", "app.kubernetes.io/component": "operator"}


def network_policy(job: str, namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    """Only the job's own pods reach its pods; the operator reaches its NATS; the metrics namespaces scrape."""
    own = {"rlboost.io/job": job}
    operator_ns = (
        {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}}
        if settings.operator_namespace
        else {}
    )
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {"matchLabels": own}}]},
        {
            "from": [{"namespaceSelector": operator_ns, "podSelector": {"matchLabels": OPERATOR_POD_LABELS}}],
            "ports": [{"port": NATS_PORT, "protocol": "TCP"}],
        },
    ]
    if settings.metrics_namespace_labels:
        # the weight-server serves /metrics on its API port (reads there need the job's tokens)
        ports = [{"port": port, "protocol": "TCP"} for port in (METRICS_PORT, WEIGHTS_PORT)]
        ingress.append(
            {"from": [{"namespaceSelector": {"matchLabels": settings.metrics_namespace_labels}}], "ports": ports}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(names(job)["network_policy"], namespace, labels(job, "network-policy")),
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
