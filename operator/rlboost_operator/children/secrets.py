"""The job's credentials Secret (made once, never rewritten but for the operator's worker-identity.json item):
the items of rlboost.auth.credentials, of which each role's pods mount only their ROLE_ITEMS at
/etc/rlboost/credentials."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from rlboost.auth.credentials import nats_password_file
from rlboost_operator.children.naming import labels, names
from rlboost_operator.children.pod import meta


def secret(name: str, namespace: str, lbl: dict[str, str], items: Mapping[str, bytes]) -> dict[str, Any]:
    """An Opaque Secret of `items` (base64 as the API wants them)."""
    data = {key: base64.b64encode(value).decode() for key, value in items.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": meta(name, namespace, lbl),
        "data": data,
    }


def credentials_secret(job: str, namespace: str, items: Mapping[str, bytes]) -> dict[str, Any]:
    """The job's credentials (rlboost.auth.credentials.generate_items with tls_hosts(job, namespace))."""
    return secret(names(job)["credentials"], namespace, labels(job, "credentials"), items)


def secret_items(obj: dict[str, Any]) -> dict[str, bytes]:
    """A Secret's items, decoded."""
    return {key: base64.b64decode(value) for key, value in (obj.get("data") or {}).items()}


def operator_nats_password(credentials: Mapping[str, bytes]) -> str:
    return credentials[nats_password_file("operator")].decode()
