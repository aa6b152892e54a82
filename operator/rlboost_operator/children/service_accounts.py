"""A worker's identity (issue 14): each pool's pods run as the job's ServiceAccount of that pool
(`<job>-reserved-worker`, `<job>-spot-worker`; no API token mounted) and get a projected service-account token for
the audience `rlboost/<namespace>/<job>` (rlboost.auth.worker_identity.audience) at IDENTITY_TOKEN, which the worker
presents at each registration (`--identity-token-file`; the kubelet rotates it). The manager checks it against the
cluster's keys, which the operator keeps in the credentials item `worker-identity.json` (cluster_keys.py)."""

from __future__ import annotations

from typing import Any

from rlboost.auth.worker_identity import audience
from rlboost_operator.children.naming import WORKER_POOLS, labels, names
from rlboost_operator.children.pod import meta

IDENTITY_TOKEN_LIFETIME_S = 3600  # the kubelet renews the token at 80% of this; the worker re-reads it each Register


def worker_service_accounts(job: str) -> dict[str, str]:
    """The job's worker ServiceAccounts -> the pool whose pods run as each (ClusterIdentity.service_accounts)."""
    n = names(job)
    return {n[f"{pool}_account"]: pool for pool in WORKER_POOLS}


def service_account(job: str, namespace: str, pool: str) -> dict[str, Any]:
    """The ServiceAccount a pool's worker pods run as: what their projected token names, so what the manager binds
    the pool to. It holds no API rights (no Role names it) and mounts no API token."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": meta(names(job)[f"{pool}_account"], namespace, labels(job, "rollout-worker", pool)),
        "automountServiceAccountToken": False,
    }


def identity_volume(job: str, namespace: str) -> dict[str, Any]:
    """A projected service-account token for the job's audience only: good for proving the pod to the job's manager,
    for nothing else (the API server refuses a token of another audience)."""
    token = {"audience": audience(namespace, job), "expirationSeconds": IDENTITY_TOKEN_LIFETIME_S, "path": "token"}
    return {"name": "identity", "projected": {"sources": [{"serviceAccountToken": token}], "defaultMode": 0o440}}
