"""The cluster lane's service-account token signing: where the stand-in begins for what a real API server and
kubelet do for projected service-account tokens.

On a cluster the API server holds the signing key (--service-account-signing-key-file), publishes its public half
at `/openid/v1/jwks` and its issuer at `/.well-known/openid-configuration`, and signs, through the TokenRequest
API, the token a kubelet writes into a pod's `projected` volume. In the lane, kube_api.py (kmock) publishes the
keys of a key file this module makes, and podlet.py signs each pod's token itself with the same file (shared by
path): the tokens have a real kubelet's shape (iss, aud, exp/iat/nbf, sub `system:serviceaccount:<ns>:<sa>`,
`kubernetes.io` naming the namespace, pod and service account), so the rollout-manager checks them as on a cluster.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm

ISSUER = "https://kubernetes.default.svc.cluster.local"  # a cluster's default --service-account-issuer
ALGORITHM = "ES256"


def load_or_make_key(path: Path) -> ec.EllipticCurvePrivateKey:
    """The lane's signing key (EC P-256, PEM), made at `path` (mode 0600) when it is not there yet."""
    if not path.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{path}: not an EC private key; delete it and the lane makes a new one")
    return key


def key_id(key: ec.EllipticCurvePrivateKey) -> str:
    """The kid as the API server derives it: base64url of the SHA-256 of the public key's DER."""
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()


def jwks(key: ec.EllipticCurvePrivateKey) -> dict[str, Any]:
    """What `/openid/v1/jwks` serves for `key`."""
    jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    return {"keys": [{**jwk, "kid": key_id(key), "use": "sig", "alg": ALGORITHM}]}


def openid_configuration(api_url: str) -> dict[str, Any]:
    """What `/.well-known/openid-configuration` serves."""
    return {
        "issuer": ISSUER,
        "jwks_uri": f"{api_url}/openid/v1/jwks",
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": [ALGORITHM],
    }


def pod_token(
    key: ec.EllipticCurvePrivateKey,
    audience: str,
    namespace: str,
    pod: tuple[str, str],
    account: tuple[str, str],
    lifetime_s: int,
    now: float | None = None,
) -> str:
    """A projected service-account token of pod (name, uid) running as service account (name, uid)."""
    issued = int(time.time() if now is None else now)
    claims = {
        "iss": ISSUER,
        "aud": [audience],
        "sub": f"system:serviceaccount:{namespace}:{account[0]}",
        "iat": issued,
        "nbf": issued,
        "exp": issued + lifetime_s,
        "kubernetes.io": {
            "namespace": namespace,
            "pod": {"name": pod[0], "uid": pod[1]},
            "serviceaccount": {"name": account[0], "uid": account[1]},
        },
    }
    return jwt.encode(claims, key, algorithm=ALGORITHM, headers={"kid": key_id(key)})
