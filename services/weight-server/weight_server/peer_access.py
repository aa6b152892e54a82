"""Who may write the peer directory (issue 31 item 3): each entry is bound to the worker that registered it.

Every worker holds the job's worker token, so the token says only "a worker of this job"; with it alone anyone
could register peers under another worker's id (pointing at a dead address), delete another worker's entry, or add
thousands. Now each peer route (PUT/DELETE /v1/peers/{worker_id}, POST /v1/sources) also needs the worker's identity
proof in `X-Rlboost-Identity` (rlboost.wire.peers_io.HEADER_IDENTITY): the same proof it registers with the
manager with (the pod's projected service-account token on Kubernetes, the runner's HMAC token locally;
rlboost.auth.worker_identity). It must prove the worker id the call names: only `spot-3` registers, heartbeats,
leaves or asks as `spot-3`. Refusals are counted in rlboost_weights_peer_refused_total{reason}. Without the job's
identity items (a weight-server run alone, without --credentials-dir) the directory is open to the read token,
as before.
"""

from __future__ import annotations

import logging
import time

from fastapi import Request

from rlboost.auth.worker_identity import IdentityRefused, WorkerIdentityVerifier
from rlboost.wire.peers_io import HEADER_IDENTITY

from .errors import ErrorKind, StoreError
from .metrics import WeightServerMetrics

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0  # a flood of refusals is one line per period (the counter has every one)


class PeerAccess:
    """The identity check of the peer routes (None verifier: open, as without the job's credentials)."""

    def __init__(self, verifier: WorkerIdentityVerifier | None, metrics: WeightServerMetrics) -> None:
        self.verifier, self.metrics = verifier, metrics
        self._logged_at: float | None = None  # refusals are logged at most once per LOG_EVERY_S, with a count
        self._unlogged = 0

    def check(self, request: Request, worker: str) -> None:
        """The caller proves it is `worker`, or StoreError (401 no/invalid proof, 403 another worker's)."""
        if self.verifier is None:
            return
        try:
            self.verifier.identify(request.headers.get(HEADER_IDENTITY, ""), worker, HEADER_IDENTITY)
        except IdentityRefused as err:
            reason = "denied" if err.denied else "unauthenticated"
            self.metrics.peer_refused.labels(reason).inc()
            self._log(worker, reason, err)
            kind = ErrorKind.FORBIDDEN if err.denied else ErrorKind.UNAUTHORIZED
            raise StoreError(kind, str(err), HEADER_IDENTITY) from None

    def _log(self, worker: str, reason: str, err: IdentityRefused) -> None:
        now = time.monotonic()
        self._unlogged += 1
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            return
        extra = {"worker": worker[:64], "reason": reason, "error": str(err)[:300], "refused": self._unlogged}
        log.warning("peer route refused", extra=extra)
        self._logged_at, self._unlogged = now, 0
