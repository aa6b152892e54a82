"""How every rlboost process connects to its job's NATS: `nats.connect(url, **connect_options(dir, user))`.

A role connects as its NATS user (rlboost.auth.nats_config gives each user its rights) with the password from
the job's credentials, over TLS verified with the job CA when the credentials hold `ca.crt` (Kubernetes).
With no credentials directory ('': a service run alone in a unit test) it connects anonymously, as before.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from rlboost.auth.credentials import JobCredentials


def client_options(user: str, password: str, ca: bytes | None = None, tls_hostname: str = "") -> dict[str, Any]:
    """nats.connect keyword arguments for `user`; TLS verified with `ca` (PEM) when given. `tls_hostname`: the name
    the server's certificate is checked against when the URL's host is not it (a test, a forwarded port)."""
    out: dict[str, Any] = {"user": user, "password": password}
    if ca is not None:
        out["tls"] = ssl.create_default_context(cadata=ca.decode())
        if tls_hostname:
            out["tls_hostname"] = tls_hostname
    return out


def connect_options(credentials_dir: str | Path, user: str) -> dict[str, Any]:
    """nats.connect keyword arguments for `user` from the job's credentials directory; {} when it is ''."""
    if not str(credentials_dir):
        return {}
    creds = JobCredentials(Path(credentials_dir))
    return client_options(user, creds.nats_password(user), creds.ca())
