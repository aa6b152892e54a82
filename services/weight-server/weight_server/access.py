"""Who may read and who may write the weight-server, and the refusals that say how to get in.

With the job's credentials (`--credentials-dir`): reads (versions, manifests, payloads, sync plans, compacted
deltas, assets) need the worker, trainer or observer token; writes (versions, assets) need the trainer token.
Without (a weight-server run alone, or one the operator still renders with --token-file): writes need the
upload token, reads the --read-token-file token when one is given (or the upload token), else they are open.
/healthz and /metrics stay open: probes and Prometheus scrape them without credentials.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from rlboost.auth.credentials import JobCredentials

from .errors import ErrorKind, StoreError

_WHERE = "of the job's credentials (--credentials-dir; `rlboost local` makes <run dir>/credentials)"


@dataclass(frozen=True)
class Access:
    """The tokens that may upload and read (`read` None: open reads), and what a refusal tells the client."""

    upload: tuple[str, ...]
    read: tuple[str, ...] | None
    upload_hint: str = "the job token"
    read_hint: str = "the read token"

    def __post_init__(self) -> None:
        if not all(self.upload):
            raise ValueError("an upload token is required")

    @classmethod
    def tokens(cls, upload: str, read: str | None = None) -> Access:
        """--token-file's upload token; --read-token-file's (if any) guards reads, which the upload token may do."""
        return cls((upload,), None if read is None else (read, upload))

    @classmethod
    def from_credentials(cls, directory: str | Path) -> Access:
        creds = JobCredentials(Path(directory))
        trainer = creds.token("trainer")
        return cls(
            upload=(trainer,),
            read=(creds.token("worker"), trainer, creds.token("observer")),
            upload_hint=f"the trainer token (token-trainer {_WHERE})",
            read_hint=f"a worker, trainer or observer token (token-worker, token-trainer or token-observer {_WHERE})",
        )

    def check_read(self, given: str) -> None:
        if self.read is not None and not _any_match(given, self.read):
            raise StoreError(
                ErrorKind.UNAUTHORIZED, f"reads need 'Authorization: Bearer <{self.read_hint}>'", "Authorization"
            )

    def check_upload(self, given: str) -> None:
        if _any_match(given, self.upload):
            return
        reader = self.read is not None and _any_match(given, self.read)  # a valid token, of a role that only reads
        kind = ErrorKind.FORBIDDEN if reader else ErrorKind.UNAUTHORIZED
        what = "this token may only read; uploads" if reader else "uploads"
        raise StoreError(kind, f"{what} need 'Authorization: Bearer <{self.upload_hint}>'", "Authorization")


def _any_match(given: str, tokens: tuple[str, ...]) -> bool:
    """Constant-time against each token (no early exit: the time does not say which one was close)."""
    presented = given.encode()
    hits = [hmac.compare_digest(presented, t.encode()) for t in tokens]
    return bool(given) and any(hits)
