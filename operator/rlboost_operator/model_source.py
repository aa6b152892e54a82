"""Whether an RLJob's model can be had: what the operator checks before creating children, and what a failed
`fetch-model` init container (children.model.fetch_model_container) means. Pure, apart from `missing_model_objects`,
which only GETs.

A fetcher that fails writes one line, `spec.model.<field>: <Reason>: <detail>` (rlboost.models.fetch), to its
termination message. Its exit code says whose problem it is: 3 (or 2) the source cannot be used, so the job fails
at once; anything else (4: unreachable) may be transient, so the job fails only after FETCH_ATTEMPTS tries,
rather than crash-looping unseen.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from rlboost.spec import ModelSpec
from rlboost_operator.children.model import FETCH_CONTAINER

PRECHECK_REASONS = {"ClaimNotFound", "SecretNotFound", "SecretKeyMissing"}  # missing_model_objects' reasons
# rlboost.models.errors' codes for "retrying will not help", restated: importing rlboost.models would pull the
# model factory's dependencies (torch, transformers) into the operator's image (tests/deploy/test_dockerfiles.py)
EXIT_USAGE, EXIT_BAD_SOURCE = 2, 3
FETCH_ATTEMPTS = 3  # failed tries of a possibly transient fetch (unreachable) before the job is Failed
_LINE = re.compile(r"spec\.model\.(\w+): (\w+): (.+)")


class ModelProblem(NamedTuple):
    """Why the model cannot be had: the spec.model field at fault, a one-word reason, a message."""

    field: str
    reason: str
    message: str


Getter = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]


async def missing_model_objects(get: Getter, namespace: str, model: ModelSpec) -> ModelProblem | None:
    """What the model source names that does not exist in the namespace: the claim ('pvc') or the token Secret
    and its key `token` ('huggingface'). `get(kind, namespace, name)` is the Kubernetes client's GET."""
    if model.source == "pvc" and await get("PersistentVolumeClaim", namespace, model.claim_name) is None:
        return ModelProblem(
            "claimName",
            "ClaimNotFound",
            f"PersistentVolumeClaim {model.claim_name!r} does not exist in namespace {namespace!r}; create it (holding "
            "the model directory) or fix model.claimName",
        )
    if model.source == "huggingface" and model.token_secret:
        secret = await get("Secret", namespace, model.token_secret)
        if secret is None:
            return ModelProblem(
                "tokenSecret",
                "SecretNotFound",
                f"Secret {model.token_secret!r} does not exist in namespace {namespace!r}; create it with the Hub token "
                "under the key 'token'",
            )
        if not _secret_value(secret, "token"):
            return ModelProblem(
                "tokenSecret",
                "SecretKeyMissing",
                f"Secret {model.token_secret!r} has no non-empty key 'token' (the Hugging Face access token)",
            )
    return None


def without_precheck_failure(conditions: list[Mapping[str, Any]] | None) -> list[Mapping[str, Any]]:
    """The conditions less a ModelReady=False that missing_model_objects set (once what it missed exists)."""
    return [c for c in conditions or [] if not (c.get("type") == "ModelReady" and c.get("reason") in PRECHECK_REASONS)]


def _secret_value(secret: Mapping[str, Any], key: str) -> str:
    data, plain = secret.get("data") or {}, secret.get("stringData") or {}
    if plain.get(key):
        return str(plain[key])
    try:
        return base64.b64decode(data.get(key) or "").decode(errors="replace").strip()
    except ValueError:
        return ""


def fetch_failure(pod: Mapping[str, Any]) -> ModelProblem | None:
    """The model problem a pod's `fetch-model` init container reports, once it should fail the job; else None."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != FETCH_CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if not terminated or int(terminated.get("exitCode") or 0) == 0:
            return None
        code, tries = int(terminated["exitCode"]), int(status.get("restartCount") or 0) + 1
        if code not in (EXIT_USAGE, EXIT_BAD_SOURCE) and tries < FETCH_ATTEMPTS:
            return None  # possibly transient: the kubelet tries again
        return parse_fetch_message(str(terminated.get("message") or ""), code)
    return None


def parse_fetch_message(message: str, exit_code: int) -> ModelProblem:
    """The fetcher's line `spec.model.<field>: <Reason>: <detail>`, or (logs instead: it crashed) the last line."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    for line in lines:
        found = _LINE.search(line)
        if found:
            return ModelProblem(found.group(1), found.group(2), found.group(3)[:1000])
    tail = lines[-1][:1000] if lines else "no message"
    return ModelProblem("source", "FetchFailed", f"the model fetcher exited with code {exit_code}: {tail}")
