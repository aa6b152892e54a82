"""A job's credentials: one directory of small files, made once per job, read by every service.

Locally `rlboost local` makes it at `<run dir>/credentials/`; on Kubernetes the operator makes the Secret
`<job>-credentials` with the same file names as keys and mounts, into each role's pods, only the items that
role needs (`ROLE_ITEMS`) at `/etc/rlboost/credentials`. Services take `--credentials-dir DIR`.

Files (every one mode 0600):
- `token-<role>`: the bearer token a client of that role presents on gRPC (`authorization: Bearer ...`) and
  HTTP. Roles: `trainer` (manager's Rollout; weight-server uploads), `worker` (manager's worker stream;
  weight-server reads), `observer` (read-only status: `rlboost local`'s report, the operator, dashboards),
  `env-runner` (the env-runners' Attach stream to the manager: agentic episodes).
- `nats-<user>.pass`: the NATS password of user `<user>` (operator, trainer, manager, worker, weight-server,
  observer); the NATS server's configuration gives each user publish/subscribe rights on its job's subjects.
- `manifest.key` / `manifest.pub`: the Ed25519 key pair (PEM) the trainer signs each weight version's
  manifest with and workers verify it with.
- `manager-ticket.key`: the rollout-manager's HMAC key for the tickets it gives with each assignment (a worker
  hands a ticket back with a response it held across a manager restart; only the manager mounts it, and it
  outlives the manager's process so a restarted manager can check the tickets its predecessor gave).
- `colocation.key`: the HMAC key colocation acks are bound to worker ids with (rlboost.auth.colocation_acks):
  the manager derives each reserved worker's own ack key from it and hands it over on the worker's session;
  the trainer derives the same key to check each ack. Mounted by the manager and the trainer only.
- `worker-identity.key`: the HMAC key `rlboost local` mints each worker's identity proof with, and the manager
  checks it with (rlboost.auth.worker_identity); mounted by the manager and the weight-server (its peer
  directory binds each entry to the worker that proves its id).
- `worker-identity.json` (Kubernetes only, written by the operator): the cluster's service-account token
  signing keys, the job's audience and the workers' service accounts, which the manager checks each worker
  pod's projected token against (rlboost.auth.worker_identity.ClusterIdentity).
- `ca.crt`, `tls-<service>.crt`, `tls-<service>.key`: TLS (made when `tls_hosts` is given, as the operator
  does): a per-job CA and a server certificate for the manager, the weight-server and NATS.

Run `python -m rlboost.auth.credentials DIR` to make a directory by hand.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TOKEN_ROLES = ("trainer", "worker", "observer")
# Roles whose token was added after the first ones: an older job's credentials get it (added_items), the rest kept.
# `env-runner`: the env-runners' stream to the manager (agentic episodes).
ADDED_TOKEN_ROLES = ("env-runner",)
NATS_USERS = ("operator", "trainer", "manager", "worker", "weight-server", "observer")
TLS_SERVICES = ("manager", "weight-server", "nats")
SIGNING_KEY, VERIFY_KEY, CA_CERT = "manifest.key", "manifest.pub", "ca.crt"
TICKET_KEY = "manager-ticket.key"
COLOCATION_KEY = "colocation.key"
WORKER_IDENTITY_KEY = "worker-identity.key"  # rlboost.auth.worker_identity.LOCAL_KEY
WORKER_IDENTITY_CLUSTER = "worker-identity.json"  # rlboost.auth.worker_identity.CLUSTER_ITEM

# What each pod role mounts: everything it presents, verifies or serves with, and nothing else.
ROLE_ITEMS: dict[str, tuple[str, ...]] = {
    "trainer": ("token-trainer", "nats-trainer.pass", SIGNING_KEY, VERIFY_KEY, CA_CERT, COLOCATION_KEY),
    "worker": ("token-worker", "nats-worker.pass", VERIFY_KEY, CA_CERT),
    "manager": (
        "token-trainer",
        "token-worker",
        "token-observer",
        "token-env-runner",
        "nats-manager.pass",
        TICKET_KEY,
        CA_CERT,
        "tls-manager.crt",
        "tls-manager.key",
        COLOCATION_KEY,
        WORKER_IDENTITY_KEY,
        WORKER_IDENTITY_CLUSTER,  # written by the operator (no pod of the job starts before it is there)
    ),
    # its own stream to the manager; the observer's read of the weight-server for the model's signed tokenizer
    "env-runner": ("token-env-runner", "token-observer", VERIFY_KEY, CA_CERT),
    "weight-server": (
        "token-trainer",
        "token-worker",
        "token-observer",
        "nats-weight-server.pass",
        CA_CERT,
        "tls-weight-server.crt",
        "tls-weight-server.key",
        WORKER_IDENTITY_KEY,  # a peer entry is bound to the worker that proves its id (rlboost.weights.peers)
        WORKER_IDENTITY_CLUSTER,
    ),
    "nats": tuple(f"nats-{u}.pass" for u in NATS_USERS) + (CA_CERT, "tls-nats.crt", "tls-nats.key"),
}


class CredentialsError(ValueError):
    """A credentials directory lacks a file or holds an unusable one; the message names it and the fix."""


def token_file(role: str) -> str:
    return f"token-{role}"


def nats_password_file(user: str) -> str:
    return f"nats-{user}.pass"


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)  # also when the file already existed with wider rights


def generate_items(tls_hosts: Mapping[str, Iterable[str]] | None = None) -> dict[str, bytes]:
    """Every file of a fresh job's credentials, by name; `tls_hosts` maps a TLS service to its DNS names/IPs."""
    items = {token_file(r): secrets.token_urlsafe(32).encode() for r in TOKEN_ROLES}
    items |= {nats_password_file(u): secrets.token_urlsafe(24).encode() for u in NATS_USERS}
    items |= _signing_pair()
    items |= added_items(())
    if tls_hosts:
        items |= _tls_items(tls_hosts)
    return items


# Items a job's credentials may lack because they were made before the item existed, and how to make each.
_ADDED = {
    TICKET_KEY: lambda: secrets.token_urlsafe(32).encode(),
    COLOCATION_KEY: lambda: secrets.token_urlsafe(32).encode(),
    WORKER_IDENTITY_KEY: lambda: secrets.token_urlsafe(32).encode(),
    **{f"token-{role}": lambda: secrets.token_urlsafe(32).encode() for role in ADDED_TOKEN_ROLES},
}


def added_items(present: Iterable[str]) -> dict[str, bytes]:
    """Fresh values of the items added since a job's credentials could have been made without them, that
    `present` (the names a job's credentials hold) lacks: the operator and `rlboost local` add them to an older
    job's credentials without touching the rest (running pods hold those)."""
    have = set(present)
    return {name: make() for name, make in _ADDED.items() if name not in have}


def add_missing(directory: Path) -> None:
    """Write into an existing credentials directory the items added since it was made (added_items)."""
    for name, data in added_items(p.name for p in directory.iterdir()).items():
        write_private(directory / name, data)


def generate(directory: Path, tls_hosts: Mapping[str, Iterable[str]] | None = None) -> JobCredentials:
    """Make `directory` (mode 0700) with a fresh job's credentials and return them loaded."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, data in generate_items(tls_hosts).items():
        write_private(directory / name, data)
    return JobCredentials(directory)


def _signing_pair() -> dict[str, bytes]:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    public = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    return {SIGNING_KEY: private, VERIFY_KEY: public}


def _tls_items(tls_hosts: Mapping[str, Iterable[str]]) -> dict[str, bytes]:
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("rlboost job CA", ca_key.public_key(), ca_key, None, is_ca=True)
    items = {CA_CERT: ca.public_bytes(ser.Encoding.PEM)}
    for service, hosts in tls_hosts.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(service, key.public_key(), ca_key, ca, hosts=list(hosts))
        items[f"tls-{service}.crt"] = cert.public_bytes(ser.Encoding.PEM)
        items[f"tls-{service}.key"] = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    return items


def _certificate(name, public_key, signing_key, issuer, *, is_ca: bool = False, hosts: list[str] | None = None):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate clock skew between nodes
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _san(host: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


@dataclass(frozen=True)
class JobCredentials:
    """A loaded credentials directory; each accessor raises CredentialsError naming a missing file."""

    directory: Path

    def read(self, name: str) -> bytes:
        path = self.directory / name
        try:
            data = path.read_bytes().strip()
        except FileNotFoundError:
            raise CredentialsError(
                f"{path}: missing; this role's credentials lack {name!r} (make them with "
                "`python -m rlboost.auth.credentials DIR`, or mount the job's Secret item)"
            ) from None
        if not data:
            raise CredentialsError(f"{path}: empty; regenerate the job's credentials")
        return data

    def has(self, name: str) -> bool:
        return (self.directory / name).is_file()

    def token(self, role: str) -> str:
        """The bearer token of `role` (trainer, worker, observer)."""
        return self.read(token_file(role)).decode()

    def tokens(self) -> dict[str, str]:
        """Every role token this directory holds, by role: what a server accepts."""
        return {r: self.token(r) for r in (*TOKEN_ROLES, *ADDED_TOKEN_ROLES) if self.has(token_file(r))}

    def nats_password(self, user: str) -> str:
        return self.read(nats_password_file(user)).decode()

    def signing_key(self):
        """The trainer's Ed25519 private key."""
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        return load_pem_private_key(self.read(SIGNING_KEY), password=None)

    def verify_key(self):
        """The Ed25519 public key every worker verifies manifests with."""
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        return load_pem_public_key(self.read(VERIFY_KEY))

    def ticket_key(self) -> bytes:
        """The rollout-manager's HMAC key for assignment tickets."""
        return self.read(TICKET_KEY)

    def colocation_key(self) -> bytes:
        """The HMAC key reserved workers' colocation-ack keys derive from (manager and trainer)."""
        return self.read(COLOCATION_KEY)

    def tls(self, service: str) -> tuple[bytes, bytes, bytes] | None:
        """(CA, certificate, key) PEM of `service`'s server TLS, or None where no TLS was made (local runs)."""
        crt, key = f"tls-{service}.crt", f"tls-{service}.key"
        if not self.has(crt):
            return None
        return self.read(CA_CERT), self.read(crt), self.read(key)

    def ca(self) -> bytes | None:
        """The job CA's certificate (clients verify servers with it), or None without TLS."""
        return self.read(CA_CERT) if self.has(CA_CERT) else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rlboost.auth.credentials DIR", file=sys.stderr)
        return 2
    creds = generate(Path(args[0]))
    print(f"wrote {len(list(creds.directory.iterdir()))} files to {creds.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
