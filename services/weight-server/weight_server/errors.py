"""What the weight-server refuses, by domain kind: the planner and the store raise, app.py alone maps to HTTP.

A refusal says what is wrong in the domain's words (`ErrorKind`), a message that names the fix and the
field at fault; which HTTP status a kind becomes is app.py's business (`HTTP_STATUS` there), so the
planner and the store know nothing of HTTP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path

from rlboost.fsio import NO_SPACE


class ErrorKind(StrEnum):
    NOT_FOUND = "not_found"  # no such version, payload of that kind, or chain of deltas
    CONFLICT = "conflict"  # clashes with what is held: immutable versions, another checksum, a base gone meanwhile
    INVALID = "invalid"  # the request itself is wrong: a field missing or out of its range
    UNAUTHORIZED = "unauthorized"  # no valid bearer token
    FORBIDDEN = "forbidden"  # a valid token of a role that may not do this (a worker's upload)
    RANGE_NOT_SATISFIABLE = "range_not_satisfiable"  # a Range header that selects no bytes of the payload
    TOO_LARGE = "too_large"  # over a bound of what is held (a model asset, or all of them together)
    INSUFFICIENT_STORAGE = "insufficient_storage"  # the data directory's file system is full: nothing was stored


class StoreError(Exception):
    """A request the weight-server refuses: its domain `kind`, a message and the offending field."""

    def __init__(self, kind: ErrorKind, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.field = kind, message, field


def no_space(what: str, where: object) -> StoreError:
    """A write the full data directory refused (issue 31): one line naming the path and the field to change; what
    the server held before is kept, and nothing of the refused write remains."""
    return StoreError(
        ErrorKind.INSUFFICIENT_STORAGE,
        f"{what} could not be stored in {where}: no space left on device; free space there (the weight-server's "
        "--data-dir; on Kubernetes its volume, the operator's weightsStorage) or keep fewer versions with "
        "weightSync.retainVersions; every version held is kept",
        "weightSync.retainVersions",
    )


@contextlib.contextmanager
def storing(what: str, where: Path) -> Iterator[None]:
    """A write into the data directory; a full file system becomes a StoreError (507) naming it and the fix."""
    try:
        yield
    except OSError as err:
        if err.errno in NO_SPACE:
            raise no_space(what, where) from err
        raise
