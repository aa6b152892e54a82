"""Assignment tickets: proof that a worker was given a request, checked when it reports that request's tokens
after a manager restart.

A restarted manager adopts the responses workers held across its restart (Register.held) without having seen
them generated. Every worker shares the worker role's token, so without more a worker could report tokens for
any request of a step. So every assignment carries a ticket: HMAC-SHA256, keyed with the job's
`manager-ticket.key` (rlboost.auth.credentials; only the manager mounts it, and it outlives the process), over
(job, step, request id, worker id, lease epoch). The worker keeps it with the response and hands it back; the
new manager adopts a held response only when its ticket is the one it would give that request's assignment to
the worker id bound to the reporting stream's session (identity.py). A worker therefore cannot forge a ticket,
nor use another worker's: the worker id is in the MAC.

    book = TicketBook(creds.ticket_key(), job="demo")
    a.ticket = book.issue(a.request_id, worker_id, a.lease_epoch)
    kept = book.admit(worker_id, held)   # the refused ones are counted and logged
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re

from rlboost.wire.rollout_io import HeldResponse

from . import metrics

log = logging.getLogger(__name__)

_STEP = re.compile(r"s(-?\d+)-")  # rlboost.wire.rollout_io.request_id: s{step}-p{prompt}-g{sample}


class TicketBook:
    """Issues and checks the tickets of one job's assignments with its key."""

    def __init__(self, key: bytes, job: str) -> None:
        if not key:
            raise ValueError("ticket key: must not be empty (the job's manager-ticket.key)")
        self._key, self._job = key, job

    def issue(self, request_id: str, worker_id: str, lease_epoch: int) -> str:
        """The ticket of `request_id`'s assignment to `worker_id` under `lease_epoch` (hex)."""
        match = _STEP.match(request_id)
        step = match.group(1) if match else ""
        fields = (self._job, step, request_id, worker_id, str(lease_epoch))
        message = "\0".join(fields).encode()  # NUL cannot occur in any field: fields never run together
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def refusal(self, worker_id: str, h: HeldResponse) -> str | None:
        """Why `worker_id` may not report `h` ('ticket_missing', 'ticket_invalid'), or None when it may."""
        if not h.ticket:
            return "ticket_missing"
        expected = self.issue(h.request_id, worker_id, h.lease_epoch)
        if not hmac.compare_digest(h.ticket.encode(), expected.encode()):
            return "ticket_invalid"  # forged, or the ticket of another worker, request or lease
        return None

    def admit(self, worker_id: str, held: list[HeldResponse]) -> list[HeldResponse]:
        """The held responses `worker_id` was given; each other one is counted by reason and logged."""
        kept = []
        for h in held:
            why = self.refusal(worker_id, h)
            if why is None:
                kept.append(h)
                continue
            metrics.HELD_REFUSED.labels(why).inc()
            log.warning(
                "held response refused: no valid ticket for this worker",
                extra={"worker_id": worker_id, "request_id": h.request_id, "reason": why},
            )
        return kept
