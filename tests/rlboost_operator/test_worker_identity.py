"""Worker identities on Kubernetes (issue 14 item 1), the operator's side: worker pods run as their pool's
ServiceAccount with a projected token for the job's audience, and the operator keeps the cluster's
service-account keys in the job's credentials (worker-identity.json) for the manager.

The pure parts need nothing; the rest runs the operator against kmock (conftest: its OIDC discovery endpoints
serve a key pair of the fixture's own, standing in for the API server's). A token signed with that key, shaped
as a kubelet's, is checked by the manager's own verifier (rlboost.auth.worker_identity) against the item the
operator wrote: that is the whole chain but the kubelet.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import jwt
import kopf
import pytest

from rlboost.auth.credentials import ROLE_ITEMS, WORKER_IDENTITY_CLUSTER
from rlboost.auth.worker_identity import IdentityRefused, WorkerIdentityVerifier, audience
from rlboost.spec import JobSpec
from rlboost_operator import children, cluster_keys, credentials
from rlboost_operator.config import OperatorSettings
from rlboost_operator.kube import Kube
from tests.helpers import wait_until
from tests.rlboost_operator.conftest import ISSUER, ClusterDiscovery, operator_memo
from tests.rlboost_operator.test_operator import NS, rljob, status_of


def _pods(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs if o["kind"] == "Deployment"}


def test_worker_pods_run_as_their_pools_account_with_a_projected_token_for_the_job() -> None:
    spec = JobSpec.model_validate(
        {"rollout": {"spot": {"variants": [{"name": n, "pricePerGpuHour": 1.0} for n in "ab"]}}}
    )
    objs = children.build_children("job1", "ns1", spec, OperatorSettings(), spot_replicas=2)
    accounts = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ServiceAccount"}
    workers = {"job1-reserved-worker", "job1-spot-worker"}
    services = {"job1-trainer", "job1-manager", "job1-weight-server", "job1-nats"}  # each its own (issue 29)
    assert set(accounts) == workers | services
    assert all(a["automountServiceAccountToken"] is False for a in accounts.values())
    pods = _pods(objs)
    expected = {
        "job1-workers-reserved": "job1-reserved-worker",
        "job1-workers-spot-a": "job1-spot-worker",
        "job1-workers-spot-b": "job1-spot-worker",
    }
    for name, account in expected.items():
        pod = pods[name]
        assert pod["serviceAccountName"] == account
        assert pod["automountServiceAccountToken"] is False  # no API token: only the audience-bound one
        volume = next(v for v in pod["volumes"] if v["name"] == "identity")
        token = volume["projected"]["sources"][0]["serviceAccountToken"]
        assert token == {"audience": "rlboost/ns1/job1", "expirationSeconds": 3600, "path": "token"}
        container = pod["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "identity")
        assert mount == {"name": "identity", "mountPath": children.IDENTITY_DIR, "readOnly": True}
        cmd = container["command"]
        assert cmd[cmd.index("--identity-token-file") + 1] == f"{mount['mountPath']}/token"
    for name, account in (("job1-manager", "job1-manager"), ("job1-weights", "job1-weight-server")):
        assert pods[name]["serviceAccountName"] == account  # its own, which no worker's token names
        assert all(v["name"] != "identity" for v in pods[name]["volumes"])  # no other pod gets an identity
    assert all(v["name"] != "identity" for v in pods["job1-nats"]["volumes"])


def test_the_manager_mounts_the_cluster_identity_item() -> None:
    objs = children.build_children("job1", "ns1", JobSpec(), OperatorSettings(), spot_replicas=0)
    manager = _pods(objs)["job1-manager"]
    secret = next(v["secret"] for v in manager["volumes"] if v["name"] == "credentials")
    assert WORKER_IDENTITY_CLUSTER in [i["key"] for i in secret["items"]]
    assert WORKER_IDENTITY_CLUSTER not in ROLE_ITEMS["worker"]


@pytest.mark.parametrize(
    ("config", "jwks", "path", "problem"),
    [
        (None, {"keys": [{}]}, cluster_keys.ISSUER_PATH, "not found"),
        ({"jwks_uri": "x"}, {"keys": [{}]}, cluster_keys.ISSUER_PATH, "no `issuer`"),
        ({"issuer": "https://i"}, None, cluster_keys.JWKS_PATH, "not found"),
        ({"issuer": "https://i"}, {"keys": []}, cluster_keys.JWKS_PATH, "no `keys`"),
        ({"issuer": "https://i"}, [], cluster_keys.JWKS_PATH, "no `keys`"),
        # keys the manager could not check a token with: refused here, where the RLJob's status says so
        ({"issuer": "https://i"}, {"keys": [{}]}, cluster_keys.JWKS_PATH, "no usable signing key"),
        ({"issuer": "https://i"}, {"keys": [{"kty": "EC", "kid": "k"}]}, cluster_keys.JWKS_PATH, "no usable"),
    ],
)
def test_unusable_discovery_answers_name_the_endpoint_and_the_fix(config, jwks, path, problem) -> None:
    with pytest.raises(cluster_keys.DiscoveryError, match=f"GET {path}: .*{problem}.*issuer-discovery") as err:
        cluster_keys.parse_discovery(config, jwks)
    assert err.value.path == path


async def test_a_discovery_read_never_answered_fails_at_the_request_deadline(kube_api) -> None:
    """kmock holds the discovery request (its gate): the read gives up at the client's deadline with an error
    naming the endpoint, rather than holding the reconcile, and the cluster-keys lock, for aiohttp's 5 minutes."""
    kube_api.discovery.gate = threading.Event()
    kube = Kube(kopf.ConnectionInfo(server=kube_api.url, token="test"), request_timeout_s=0.5)
    try:
        with pytest.raises(cluster_keys.DiscoveryError, match="no answer within 0.5 s") as err:
            await credentials.read_cluster_keys(kube)
        assert err.value.path == cluster_keys.ISSUER_PATH and kube_api.discovery.held == 1
    finally:
        await kube.close()


def test_the_item_is_canonical_and_names_the_jobs_accounts_and_audience() -> None:
    keys = cluster_keys.ClusterKeys("https://issuer", {"keys": [{"kty": "EC", "kid": "k"}]})
    item = cluster_keys.identity_item("job1", "ns1", keys)
    assert item == cluster_keys.identity_item("job1", "ns1", keys)  # no rewrite of unchanged keys
    data = json.loads(item)
    assert data["audience"] == audience("ns1", "job1") and data["namespace"] == "ns1"
    assert data["service_accounts"] == {"job1-reserved-worker": "reserved", "job1-spot-worker": "spot"}


def kubelet_token(discovery: ClusterDiscovery, job: str, pod: str, account: str, namespace: str = NS) -> str:
    """A projected service-account token as the kubelet gets it from the API server, for the job's audience."""
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": [audience(namespace, job)],
        "sub": f"system:serviceaccount:{namespace}:{account}",
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod, "uid": "pod-uid"},
            "serviceaccount": {"name": account, "uid": "sa-uid"},
        },
    }
    return jwt.encode(claims, discovery.key, algorithm="ES256", headers={"kid": discovery.kid})


def _identity_item(api, job: str) -> bytes | None:
    secret = api.get("Secret", NS, f"{job}-credentials") or {}
    return children.secret_items(secret).get(WORKER_IDENTITY_CLUSTER)


def _verifier(tmp_path: Path, item: bytes, job: str) -> WorkerIdentityVerifier:
    path = tmp_path / WORKER_IDENTITY_CLUSTER
    path.write_bytes(item)
    return WorkerIdentityVerifier(job, cluster=path)


def test_the_operator_writes_the_clusters_keys_and_the_manager_checks_pods_with_them(operator, tmp_path):
    api = operator
    api.create("RLJob", rljob("ident"))
    item = wait_until(lambda: _identity_item(api, "ident"), timeout=20, what="worker-identity.json")
    for name in ("ident-reserved-worker", "ident-spot-worker"):
        account = wait_until(lambda n=name: api.get("ServiceAccount", NS, n), timeout=10, what=name)
        assert account["metadata"]["ownerReferences"][0]["name"] == "ident"
    verifier = _verifier(tmp_path, item, "ident")
    token = kubelet_token(api.discovery, "ident", "ident-workers-spot-abc", "ident-spot-worker")
    assert verifier.verify(token, "ident-workers-spot-abc", "spot").kind == "kubernetes"
    with pytest.raises(IdentityRefused) as refused:  # a spot pod cannot join as reserved
        verifier.verify(token, "ident-workers-spot-abc", "reserved")
    assert refused.value.denied
    wait_until(
        lambda: any(
            c["type"] == "WorkerIdentityReady" and c["status"] == "True"
            for c in status_of(api, "ident").get("conditions", [])
        ),
        timeout=10,
        what="WorkerIdentityReady True",
    )


def test_jobs_reconciled_within_a_refresh_period_share_one_read_of_the_keys(operator):
    """The keys are read once per identity_refresh_s (300 s here), not twice per reconcile: three jobs, each
    reconciled at least once, cost the API server the two discovery GETs of one read."""
    api = operator
    for job in ("k1", "k2", "k3"):
        api.create("RLJob", rljob(job))
    for job in ("k1", "k2", "k3"):
        wait_until(lambda j=job: api.get("Deployment", NS, f"{j}-manager"), timeout=20, what=f"{job}'s manager")
        assert _identity_item(api, job) is not None
    assert api.discovery.served == 2


@pytest.fixture
def fast_identity_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_OPERATOR_IDENTITY_REFRESH_S", "0.3")


@pytest.mark.usefixtures("fast_identity_refresh")
def test_a_key_rotation_reaches_the_jobs_credentials(operator, tmp_path):
    api = operator
    api.create("RLJob", rljob("rot"))
    first = wait_until(lambda: _identity_item(api, "rot"), timeout=20, what="worker-identity.json")
    wait_until(lambda: ("team-a", "rot") in operator_memo().jobs, timeout=10, what="the job running")
    old_token = kubelet_token(api.discovery, "rot", "rot-workers-reserved-x", "rot-reserved-worker")
    api.discovery.rotate()
    second = wait_until(lambda: (i := _identity_item(api, "rot")) != first and i, timeout=10, what="the new keys")
    verifier = _verifier(tmp_path, second, "rot")
    token = kubelet_token(api.discovery, "rot", "rot-workers-reserved-x", "rot-reserved-worker")
    assert verifier.verify(token, "rot-workers-reserved-x", "reserved").pool == "reserved"
    with pytest.raises(IdentityRefused, match="kid"):  # the old key is gone from the cluster's set
        verifier.verify(old_token, "rot-workers-reserved-x", "reserved")


def test_unreadable_keys_hold_the_job_back_and_say_why(operator, monkeypatch):
    api = operator
    monkeypatch.setattr(credentials, "IDENTITY_RETRY_S", 0.5)
    api.discovery.refuse = 403
    api.create("RLJob", rljob("nokeys"))

    def refused() -> dict[str, Any] | None:
        conds = status_of(api, "nokeys").get("conditions") or []
        return next((c for c in conds if c["type"] == "WorkerIdentityReady" and c["status"] == "False"), None)

    cond = wait_until(refused, timeout=20, what="WorkerIdentityReady False")
    assert cond["reason"] == "IssuerDiscoveryFailed"
    assert "GET /.well-known/openid-configuration" in cond["message"] and "403" in cond["message"]
    assert "system:service-account-issuer-discovery" in cond["message"]
    assert api.get("Deployment", NS, "nokeys-manager") is None  # no manager that would refuse every worker
    api.discovery.refuse = None  # the cluster's discovery fixed: the retry starts the job
    wait_until(lambda: api.get("Deployment", NS, "nokeys-manager"), timeout=20, what="the manager after the fix")
    assert _identity_item(api, "nokeys") is not None
