"""The job's ServiceAccounts (issue 14 for the workers, issue 29 for every component).

Each component's pods run as the job's account of that component: `<job>-trainer`, `<job>-manager`,
`<job>-weight-server`, `<job>-nats`, `<job>-env-runner` (a job with episodes), and per worker pool `<job>-reserved-worker`, `<job>-spot-worker`; no API token
is mounted and no Role names them. Their annotations are the chart's jobServiceAccounts.annotations (the operator
setting service_account_annotations) with the component's spec serviceAccount.annotations over them: IRSA's
eks.amazonaws.com/role-arn, GKE Workload Identity's iam.gke.io/gcp-service-account. The trainer and the services may
instead run as an existing account (serviceAccount.name); a worker pool may not: its pods get a projected
service-account token for the audience `rlboost/<namespace>/<job>` (rlboost.auth.worker_identity.audience) at
IDENTITY_TOKEN, which the worker presents at each registration (`--identity-token-file`; the kubelet rotates it). The
manager checks it against the cluster's keys, which the operator keeps in the credentials item `worker-identity.json`
(cluster_keys.py), and the account it names is the worker's pool.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlboost.auth.worker_identity import audience
from rlboost.pod_policy import PodPolicy
from rlboost.spec import JobSpec
from rlboost_operator.children.naming import WORKER_POOLS, labels, names
from rlboost_operator.children.pod import meta

IDENTITY_TOKEN_LIFETIME_S = 3600  # the kubelet renews the token at 80% of this; the worker re-reads it each Register
# A component's key (its component label; a worker pool's name) -> its account's key in names() and its labels.
ACCOUNTS: dict[str, tuple[str, str, str | None]] = {
    "trainer": ("trainer_account", "trainer", None),
    "rollout-manager": ("manager_account", "rollout-manager", None),
    "weight-server": ("weights_account", "weight-server", None),
    "nats": ("nats_account", "nats", None),
    "reserved": ("reserved_account", "rollout-worker", "reserved"),
    "spot": ("spot_account", "rollout-worker", "spot"),
    "env-runner": ("env_runner_account", "env-runner", None),
}


def component_policies(spec: JobSpec) -> dict[str, PodPolicy]:
    """Each component's pod policy, by the keys of ACCOUNTS (the env-runners' only for a job with episodes)."""
    services = spec.services
    episodes = {"env-runner": spec.rollout.env_runners} if spec.task.episodes else {}
    return {
        "trainer": spec.trainer,
        "rollout-manager": services.manager,
        "weight-server": services.weight_server,
        "nats": services.nats,
        "reserved": spec.rollout.reserved,
        "spot": spec.rollout.spot,
        **episodes,
    }


def worker_service_accounts(job: str) -> dict[str, str]:
    """The job's worker ServiceAccounts -> the pool whose pods run as each (ClusterIdentity.service_accounts)."""
    n = names(job)
    return {n[f"{pool}_account"]: pool for pool in WORKER_POOLS}


def account_name(job: str, key: str, policy: PodPolicy | None = None) -> str:
    """The ServiceAccount a component's pods run as: the existing one its spec names, else the job's own."""
    if policy is not None and policy.service_account.name:
        return policy.service_account.name
    return names(job)[ACCOUNTS[key][0]]


def service_account(job: str, namespace: str, key: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ServiceAccount a component's pods run as (`key`: a key of ACCOUNTS, e.g. 'trainer' or a worker pool). A
    worker pool's is what its projected token names, so what the manager binds the pool to. It holds no API rights
    (no Role names it) and mounts no API token."""
    account, component, pool = ACCOUNTS[key]
    metadata = meta(names(job)[account], namespace, labels(job, component, pool))
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata, "automountServiceAccountToken": False}


def service_accounts(
    job: str, namespace: str, spec: JobSpec, chart_annotations: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The job's ServiceAccounts: one per component that does not run as an existing account, annotated with the
    chart's annotations and the component's over them."""
    return [
        service_account(job, namespace, key, {**chart_annotations, **policy.service_account.annotations})
        for key, policy in component_policies(spec).items()
        if not policy.service_account.name
    ]


def identity_volume(job: str, namespace: str) -> dict[str, Any]:
    """A projected service-account token for the job's audience only: good for proving the pod to the job's manager,
    for nothing else (the API server refuses a token of another audience)."""
    token = {"audience": audience(namespace, job), "expirationSeconds": IDENTITY_TOKEN_LIFETIME_S, "path": "token"}
    return {"name": "identity", "projected": {"sources": [{"serviceAccountToken": token}], "defaultMode": 0o440}}
