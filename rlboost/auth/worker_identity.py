"""A worker's proof of who it is: the manager binds a worker id and pool to what a worker proves, not to what it
asserts (issue 14 item 1).

Every worker holds the job's worker token, which says only "a worker of this job". Before this, a holder of it
could register under any fresh id, in either pool, and a reserved id got that id's colocation-ack key. Now each
`Register` carries `identity_proof`, one of two kinds, one per place a job runs:

- **Kubernetes:** the pod's projected service-account token, a JWT the API server signs for the audience
  `rlboost/<namespace>/<job>` (so it is good for nothing else: not the API server, not another job). It names
  the pod (the worker id is the pod's name) and its service account (one per pool: `<job>-reserved-worker` or
  `<job>-spot-worker`, so a spot pod cannot join as reserved). The manager checks it offline against the cluster's
  signing keys, which the operator reads from the API server's `/openid/v1/jwks` and keeps in the credentials
  item `worker-identity.json` (`ClusterIdentity`); it re-reads that file when it changes (key rotation).
- **Local (`rlboost local`):** the runner mints each worker a token, HMAC-SHA256 over (job, pool, worker id)
  with the credentials' `worker-identity.key` (`local_proof`), and hands it over as a file
  (`--identity-token-file`). Locally every process runs as one user, so this proves to the manager what the
  runner started; it is the same protocol as on Kubernetes and keeps out any client holding only the token.

`IdentityRefused` names what was wrong and the fix; the manager answers it with `UNAUTHENTICATED` (no or an
invalid proof) or `PERMISSION_DENIED` (a valid proof of another id or pool).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlboost.auth.credentials import WORKER_IDENTITY_CLUSTER as CLUSTER_ITEM  # the cluster's keys (the manager)
from rlboost.auth.credentials import WORKER_IDENTITY_KEY as LOCAL_KEY  # the runner's HMAC key (the manager)
from rlboost.auth.credentials import JobCredentials

LOCAL_PREFIX = "rlboost-local-v1."  # a local proof; a JWT starts with "ey" (base64 of '{"')
LEEWAY_S = 30  # clock skew tolerated on a JWT's exp/nbf/iat (the manager's and the API server's clocks)
ALGORITHMS = ["RS256", "ES256"]  # what Kubernetes signs service-account tokens with
POOLS = ("reserved", "spot")


class IdentityRefused(Exception):  # noqa: N818 (a refusal, not a fault)
    """A Register's identity proof is missing, invalid, or proves another worker; `denied`: valid, but not for
    the id or pool claimed (PERMISSION_DENIED), else UNAUTHENTICATED."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


class ClusterIdentity(BaseModel):
    """`worker-identity.json`: what the manager checks a pod's projected service-account token against. The
    operator writes it into the job's credentials Secret and refreshes it when the cluster's keys change."""

    model_config = ConfigDict(extra="forbid")

    issuer: str = Field(min_length=1, description="The API server's service-account issuer (the JWT's `iss`).")
    audience: str = Field(min_length=1, description="The audience the operator asks for: rlboost/<namespace>/<job>.")
    namespace: str = Field(min_length=1, description="The job's namespace: a token of another namespace is refused.")
    service_accounts: dict[str, Literal["reserved", "spot"]] = Field(
        min_length=1, description="Service account name -> the pool its pods may register in."
    )
    jwks: dict[str, Any] = Field(description="The cluster's signing keys, as /openid/v1/jwks serves them.")


def audience(namespace: str, job: str) -> str:
    """The audience of a job's worker tokens: the projected volume asks for it, the manager requires it."""
    return f"rlboost/{namespace}/{job}"


def local_proof(key: bytes, job: str, pool: str, worker_id: str) -> str:
    """The proof `rlboost local` gives worker `worker_id` of `pool`: only the holder of `key` can make it."""
    if not key:
        raise ValueError(f"{LOCAL_KEY}: must not be empty")
    message = "\0".join(("rlboost-worker-identity", job, pool, worker_id)).encode()
    return LOCAL_PREFIX + hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class ProvenWorker:
    """Who a proof says the worker is."""

    worker_id: str
    pool: str
    kind: Literal["local", "kubernetes"]


class _ClusterFile:
    """`worker-identity.json`, re-read when its modification time changes (the operator rotates the keys)."""

    def __init__(self, path: Path) -> None:
        self.path, self._stamp, self._value = path, None, None

    def get(self, job: str) -> tuple[ClusterIdentity, Any]:
        """The identity and its keys; `job`: the manager's, which the file's audience must be for."""
        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError as err:
            raise IdentityRefused(f"{self.path}: cannot read it ({err.strerror}); the operator writes it") from None
        if stamp != self._stamp:
            import jwt

            try:
                identity = ClusterIdentity.model_validate_json(self.path.read_bytes())
                keys = jwt.PyJWKSet.from_dict(identity.jwks)
            except (ValueError, jwt.PyJWTError) as err:
                raise IdentityRefused(f"{self.path}: unusable ({err}); the operator rewrites it") from None
            if identity.audience != audience(identity.namespace, job):
                raise IdentityRefused(
                    f"{self.path}: its audience {identity.audience!r} is not job {job!r}'s "
                    f"({audience(identity.namespace, job)!r}); the manager's --job and the file must be one job's"
                )
            self._stamp, self._value = stamp, (identity, keys)
        return self._value


class WorkerIdentityVerifier:
    """The manager's check of a Register's `identity_proof` against the worker id and pool it claims."""

    def __init__(self, job: str, local_key: bytes | None = None, cluster: Path | None = None) -> None:
        self.job, self._local_key = job, local_key
        self._cluster = _ClusterFile(cluster) if cluster is not None else None

    @classmethod
    def from_credentials(cls, directory: str, job: str) -> WorkerIdentityVerifier | None:
        """From a credentials directory (None for '': an open manager, as without credentials)."""
        if not directory:
            return None
        creds = JobCredentials(Path(directory))
        cluster = creds.directory / CLUSTER_ITEM
        return cls(job, creds.read(LOCAL_KEY), cluster if cluster.is_file() else None)

    def verify(self, proof: str, worker_id: str, pool: str) -> ProvenWorker:
        """Who `proof` proves; raises IdentityRefused unless it is worker `worker_id` of `pool`."""
        if not proof:
            raise IdentityRefused(
                "register.identity_proof: missing; a worker proves its identity with --identity-token-file (the "
                "pod's projected service-account token on Kubernetes, the runner's token for `rlboost local`)"
            )
        proven = self._local(proof, worker_id, pool) if proof.startswith(LOCAL_PREFIX) else self._jwt(proof)
        if (proven.worker_id, proven.pool) != (worker_id, pool):
            raise IdentityRefused(
                f"register.worker_id/pool: the identity proof is worker {proven.worker_id!r} of pool "
                f"{proven.pool!r}, not {worker_id!r} of {pool!r}; a worker registers under its own id and pool",
                denied=True,
            )
        return proven

    def identify(self, proof: str, worker_id: str, where: str) -> ProvenWorker:
        """Who `proof` (given in `where`, for the refusal to name) proves, whatever its pool; raises IdentityRefused
        unless it is worker `worker_id`. The weight-server binds a peer entry to it (rlboost.weights.peers)."""
        if not proof:
            raise IdentityRefused(f"{where}: missing; a worker presents its identity proof (--identity-token-file)")
        if not proof.startswith(LOCAL_PREFIX):
            proven = self._jwt(proof)
        elif self._local_key and any(
            hmac.compare_digest(proof.encode(), local_proof(self._local_key, self.job, pool, worker_id).encode())
            for pool in POOLS
        ):
            return ProvenWorker(worker_id, "", "local")
        else:
            raise IdentityRefused(f"{where}: not the runner's token for worker {worker_id!r} (made with {LOCAL_KEY})")
        if proven.worker_id != worker_id:
            raise IdentityRefused(
                f"{where}: the identity proof is worker {proven.worker_id!r}'s, not {worker_id!r}'s; a worker "
                "registers, leaves and asks only as itself",
                denied=True,
            )
        return proven

    def _local(self, proof: str, worker_id: str, pool: str) -> ProvenWorker:
        if not self._local_key or not hmac.compare_digest(
            proof.encode(), local_proof(self._local_key, self.job, pool, worker_id).encode()
        ):
            raise IdentityRefused(
                f"register.identity_proof: not the runner's token for worker {worker_id!r} of pool {pool!r} "
                f"(made with the job's {LOCAL_KEY}); start workers with `rlboost local`"
            )
        return ProvenWorker(worker_id, pool, "local")

    def _jwt(self, token: str) -> ProvenWorker:
        if self._cluster is None:
            raise IdentityRefused(
                f"register.identity_proof: a service-account token, but this manager has no {CLUSTER_ITEM} "
                "(the operator writes it into the job's credentials on Kubernetes)"
            )
        identity, keys = self._cluster.get(self.job)
        return _proven(_decode(token, identity, keys), identity)


def _decode(token: str, identity: ClusterIdentity, keys: Any) -> dict[str, Any]:
    """The claims of a service-account token signed by one of `keys`, for `identity`'s audience and issuer."""
    import jwt

    try:
        kid = jwt.get_unverified_header(token).get("kid")
        candidates = [k for k in keys.keys if kid is None or k.key_id == kid]
        if not candidates:
            raise jwt.InvalidKeyError(f"no signing key with kid {kid!r} in {CLUSTER_ITEM}")
        for key in candidates[:-1]:  # no kid (Kubernetes always sets one): any of the keys may have signed it
            with contextlib.suppress(jwt.InvalidSignatureError):
                return _decode_with(token, key, identity)
        return _decode_with(token, candidates[-1], identity)
    except jwt.PyJWTError as err:
        raise IdentityRefused(
            f"register.identity_proof: service-account token refused ({err}); the pod mounts a projected token "
            f"for audience {identity.audience!r}"
        ) from None


def _decode_with(token: str, key: Any, identity: ClusterIdentity) -> dict[str, Any]:
    import jwt

    return jwt.decode(
        token,
        key,
        algorithms=ALGORITHMS,
        audience=identity.audience,
        issuer=identity.issuer,
        leeway=LEEWAY_S,
        options={"require": ["exp", "iat", "iss", "aud", "sub"]},
    )


def _proven(claims: dict[str, Any], identity: ClusterIdentity) -> ProvenWorker:
    """The worker a verified token's `kubernetes.io` claims name: its pod, and its service account's pool."""
    k8s = claims.get("kubernetes.io")
    try:
        namespace, pod = k8s["namespace"], k8s["pod"]["name"]
        account = k8s["serviceaccount"]["name"]
    except (TypeError, KeyError):
        raise IdentityRefused(
            "register.identity_proof: the token names no pod (a bound token from a projected volume is needed, "
            "not a Secret-based one)"
        ) from None
    pool = identity.service_accounts.get(account)
    if namespace != identity.namespace or pool is None:
        raise IdentityRefused(
            f"register.identity_proof: service account {namespace}/{account} runs no worker of this job (its "
            f"workers run as {sorted(identity.service_accounts)} in {identity.namespace})",
            denied=True,
        )
    return ProvenWorker(pod, pool, "kubernetes")


def cluster_identity_json(identity: ClusterIdentity) -> bytes:
    """`worker-identity.json`'s bytes (canonical: an unchanged identity does not rewrite the Secret)."""
    return json.dumps(identity.model_dump(), sort_keys=True, separators=(",", ":")).encode()
