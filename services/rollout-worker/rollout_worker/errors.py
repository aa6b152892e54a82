"""Why a worker's session ends, or one attempt to connect it fails; and how a gRPC failure reads in them."""

from __future__ import annotations

import grpc


class SessionEndedError(RuntimeError):
    """The session cannot go on; the message says why and what to fix (the worker exits 1 with it)."""


class ManagerUnreachableError(SessionEndedError):
    """The rollout-manager could not be reached (or refused to register us) within the reconnect window."""


class IdentityProofUnreadableError(SessionEndedError):
    """--identity-token-file could not be read at a registration: without it the manager refuses this worker."""


class NotConnectedError(Exception):
    """One connection attempt failed before registration; the session retries it."""


def describe(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {err.details()}"
    return f"{type(err).__name__}: {err}"
