"""The cluster's service-account keys, for the manager's check of worker identities (issue 14 item 1).

A worker pod proves who it is with its projected service-account token (children.identity_volume); the manager
checks it offline, against `worker-identity.json` in the job's credentials (rlboost.auth.worker_identity.
ClusterIdentity). The operator makes that item from what the API server publishes for OIDC discovery:
- `GET /.well-known/openid-configuration` -> `issuer` (the tokens' `iss`, the API server's
  --service-account-issuer);
- `GET /openid/v1/jwks` -> the public keys the API server signs service-account tokens with.
Every service account may read both on a real cluster: the default ClusterRoleBinding
`system:service-account-issuer-discovery` grants them to the group `system:serviceaccounts`, so the operator's
RBAC (deploy/helm) needs nothing for them. The operator writes the item before the manager starts, and
a loop re-reads the keys and rewrites the item when they change (a key rotation reaches the running manager:
a mounted Secret updates in place and the manager re-reads the file when it changes).

Pure: the API calls are credentials.py's; this module turns their answers into the item, or into an error naming
the endpoint and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jwt

from rlboost.auth.worker_identity import ClusterIdentity, audience, cluster_identity_json
from rlboost_operator.children.service_accounts import worker_service_accounts

ISSUER_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/openid/v1/jwks"
FIX = (
    "the operator reads the cluster's service-account issuer and signing keys there to check worker identities; "
    "the API server serves them when it runs with --service-account-issuer (every cluster since Kubernetes "
    "1.21), to every service account through the default ClusterRoleBinding "
    "system:service-account-issuer-discovery (restore it if it was removed)"
)
CONDITION = "WorkerIdentityReady"


class DiscoveryError(Exception):
    """The API server's OIDC discovery answered nothing usable; the message names the endpoint and the fix."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"GET {path}: {problem}; {FIX}")
        self.path = path


@dataclass(frozen=True)
class ClusterKeys:
    """The service-account issuer and its signing keys, as the API server serves them."""

    issuer: str
    jwks: dict[str, Any]


def parse_discovery(config: Any, jwks: Any) -> ClusterKeys:
    """ClusterKeys from the two endpoints' JSON answers (None: the endpoint answered 404)."""
    if config is None:
        raise DiscoveryError(ISSUER_PATH, "not found")
    issuer = config.get("issuer") if isinstance(config, dict) else None
    if not isinstance(issuer, str) or not issuer:
        raise DiscoveryError(ISSUER_PATH, "the answer names no `issuer`")
    if jwks is None:
        raise DiscoveryError(JWKS_PATH, "not found")
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(keys, list) or not keys:
        raise DiscoveryError(JWKS_PATH, "the answer holds no `keys`")
    _check_usable(jwks)
    return ClusterKeys(issuer, jwks)


def _check_usable(jwks: dict[str, Any]) -> None:
    """Refuse a key set the manager could not check a token with, here where the RLJob's status can say so,
    rather than in the manager, where it would refuse every worker of the job."""
    try:
        jwt.PyJWKSet.from_dict(jwks)
    except jwt.PyJWTError as err:
        raise DiscoveryError(JWKS_PATH, f"no usable signing key ({err})") from None


def cluster_identity(job: str, namespace: str, keys: ClusterKeys) -> ClusterIdentity:
    """What the job's manager checks its workers' tokens against."""
    return ClusterIdentity(
        issuer=keys.issuer,
        audience=audience(namespace, job),
        namespace=namespace,
        service_accounts=worker_service_accounts(job),
        jwks=keys.jwks,
    )


def identity_item(job: str, namespace: str, keys: ClusterKeys) -> bytes:
    """`worker-identity.json`'s bytes (canonical: unchanged keys give unchanged bytes, so no rewrite)."""
    return cluster_identity_json(cluster_identity(job, namespace, keys))
