"""rlboost.auth.worker_identity: the manager's check of a worker's identity proof.

The Kubernetes kind is a pod's projected service-account token. No API server runs here, so the tokens are
minted by the test with its own RSA key, shaped as the kubelet's (claims of a bound token, `kid` header), and
the key is served to the verifier as `/openid/v1/jwks` serves it: this is where the stand-in begins. What is
checked is the verifier's side: signature, audience, issuer, expiry, namespace, pod and service account.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from rlboost.auth.worker_identity import (
    ClusterIdentity,
    IdentityRefused,
    ProvenWorker,
    WorkerIdentityVerifier,
    audience,
    cluster_identity_json,
    local_proof,
)

ISSUER = "https://kubernetes.default.svc.cluster.local"
NAMESPACE, JOB = "ml", "grpo"
ACCOUNTS = {"grpo-reserved-worker": "reserved", "grpo-spot-worker": "spot"}


def _key(kid: str) -> tuple[rsa.RSAPrivateKey, dict]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    return private, public | {"kid": kid, "use": "sig", "alg": "RS256"}


def _token(
    private,
    kid: str,
    pod: str,
    account: str,
    *,
    namespace: str = NAMESPACE,
    aud: str = "",
    ttl: int = 600,
    alg: str = "RS256",
) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": [aud or audience(NAMESPACE, JOB)],
        "iat": now,
        "nbf": now,
        "exp": now + ttl,
        "sub": f"system:serviceaccount:{namespace}:{account}",
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod, "uid": "u1"},
            "serviceaccount": {"name": account, "uid": "u2"},
        },
    }
    return jwt.encode(claims, private, algorithm=alg, headers={"kid": kid})


def _write(path: Path, *public: dict) -> None:
    identity = ClusterIdentity(
        issuer=ISSUER,
        audience=audience(NAMESPACE, JOB),
        namespace=NAMESPACE,
        service_accounts=ACCOUNTS,
        jwks={"keys": list(public)},
    )
    path.write_bytes(cluster_identity_json(identity))


@pytest.fixture
def signer(tmp_path: Path):
    private, public = _key("k1")
    path = tmp_path / "worker-identity.json"
    _write(path, public)
    return private, WorkerIdentityVerifier(JOB, b"local-key", path), path


def test_a_pods_projected_token_proves_its_pod_name_and_its_accounts_pool(signer):
    private, verifier, _ = signer
    token = _token(private, "k1", "grpo-spot-7f9c-abcde", "grpo-spot-worker")
    assert verifier.verify(token, "grpo-spot-7f9c-abcde", "spot") == ProvenWorker(
        "grpo-spot-7f9c-abcde", "spot", "kubernetes"
    )


@pytest.mark.parametrize(
    ("worker_id", "pool", "field"),
    [("grpo-spot-other", "spot", "worker_id"), ("grpo-spot-7f9c-abcde", "reserved", "pool")],
)
def test_a_valid_token_claiming_another_pod_or_pool_is_denied(signer, worker_id, pool, field):
    private, verifier, _ = signer
    token = _token(private, "k1", "grpo-spot-7f9c-abcde", "grpo-spot-worker")
    with pytest.raises(IdentityRefused, match="register.worker_id/pool") as err:
        verifier.verify(token, worker_id, pool)
    assert err.value.denied


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"aud": "https://kubernetes.default.svc"}, "Audience"),  # the pod's API token: not for this job
        ({"aud": "rlboost/ml/other-job"}, "Audience"),
        ({"ttl": -120}, "expired"),
        ({"namespace": "other"}, "runs no worker of this job"),
    ],
)
def test_tokens_for_another_audience_job_time_or_namespace_are_refused(signer, kwargs, match):
    private, verifier, _ = signer
    token = _token(private, "k1", "p", "grpo-spot-worker", **kwargs)
    with pytest.raises(IdentityRefused, match=match):
        verifier.verify(token, "p", "spot")


def test_another_service_account_cannot_join_either_pool(signer):
    private, verifier, _ = signer
    token = _token(private, "k1", "p", "default")
    with pytest.raises(IdentityRefused, match="default runs no worker") as err:
        verifier.verify(token, "p", "spot")
    assert err.value.denied


def test_forged_signatures_unknown_keys_and_algorithm_tricks_are_refused(signer, tmp_path):
    private, verifier, path = signer
    other, _ = _key("k1")  # same kid, another key: a forged signature
    with pytest.raises(IdentityRefused, match="Signature verification failed"):
        verifier.verify(_token(other, "k1", "p", "grpo-spot-worker"), "p", "spot")
    with pytest.raises(IdentityRefused, match="no signing key with kid 'k9'"):
        verifier.verify(_token(private, "k9", "p", "grpo-spot-worker"), "p", "spot")
    unsigned = jwt.encode({"iss": ISSUER}, None, algorithm="none")
    with pytest.raises(IdentityRefused):
        verifier.verify(unsigned, "p", "spot")
    for proof in ("eyJ.garbage.x", "not-a-token"):
        with pytest.raises(IdentityRefused):
            verifier.verify(proof, "p", "spot")


def test_a_rotated_cluster_key_is_picked_up_when_the_operator_rewrites_the_file(signer):
    _, verifier, path = signer
    new_private, new_public = _key("k2")
    token = _token(new_private, "k2", "p", "grpo-reserved-worker")
    with pytest.raises(IdentityRefused, match="k2"):
        verifier.verify(token, "p", "reserved")
    _write(path, new_public)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a coarse clock would hide the change
    assert verifier.verify(token, "p", "reserved").pool == "reserved"


def test_local_proofs_are_bound_to_job_pool_and_id():
    verifier = WorkerIdentityVerifier(JOB, b"local-key")
    proof = local_proof(b"local-key", JOB, "spot", "spot-0")
    assert verifier.verify(proof, "spot-0", "spot").kind == "local"
    for worker_id, pool in (("spot-1", "spot"), ("spot-0", "reserved")):
        with pytest.raises(IdentityRefused, match="not the runner's token"):
            verifier.verify(proof, worker_id, pool)
    with pytest.raises(IdentityRefused, match="not the runner's token"):
        verifier.verify(local_proof(b"local-key", "other-job", "spot", "spot-0"), "spot-0", "spot")
    with pytest.raises(IdentityRefused, match="missing"):
        verifier.verify("", "spot-0", "spot")
    with pytest.raises(IdentityRefused, match="no worker-identity.json"):
        verifier.verify(_token(_key("k")[0], "k", "p", "a"), "p", "spot")


def test_an_unusable_cluster_file_is_refused_with_its_path(tmp_path):
    path = tmp_path / "worker-identity.json"
    path.write_text('{"issuer": ""}')
    verifier = WorkerIdentityVerifier(JOB, b"k", path)
    with pytest.raises(IdentityRefused, match="worker-identity.json: unusable"):
        verifier.verify(_token(_key("k")[0], "k", "p", "a"), "p", "spot")


def test_another_jobs_cluster_file_or_none_at_all_admits_nobody(signer, tmp_path):
    """A manager handed another job's worker-identity.json must not take that job's tokens; a missing file is
    a refusal naming it, not an OSError."""
    private, _, path = signer
    token = _token(private, "k1", "p", "grpo-spot-worker")
    with pytest.raises(IdentityRefused, match="is not job 'other'"):
        WorkerIdentityVerifier("other", b"k", path).verify(token, "p", "spot")
    with pytest.raises(IdentityRefused, match="cannot read it"):
        WorkerIdentityVerifier(JOB, b"k", tmp_path / "gone.json").verify(token, "p", "spot")


def test_a_token_without_kid_is_checked_against_every_key(tmp_path):
    """During a rotation the file holds old and new keys; a token with no kid is tried against each."""
    old_private, old_public = _key("old")
    new_private, new_public = _key("new")
    path = tmp_path / "worker-identity.json"
    _write(
        path, {k: v for k, v in old_public.items() if k != "kid"}, {k: v for k, v in new_public.items() if k != "kid"}
    )
    verifier = WorkerIdentityVerifier(JOB, b"k", path)
    for private in (old_private, new_private):
        token = jwt.encode(
            jwt.decode(_token(private, "x", "p", "grpo-spot-worker"), options={"verify_signature": False}),
            private,
            algorithm="RS256",
        )
        assert verifier.verify(token, "p", "spot").worker_id == "p"
