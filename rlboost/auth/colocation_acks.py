"""Colocation acks bound to the worker that sent them: a per-worker MAC key the trainer can derive.

Every worker connects to NATS as the one user `worker`, so the NATS server cannot say who published an ack
on `colocation-acks`; the trainer used to take the ack's `worker_id` as given, and a worker could ack a release
or resume in another reserved worker's name (the trainer then stops waiting early). Now each ack carries a MAC
that only the worker it names can make:

- the job's `colocation.key` (rlboost.auth.credentials) is mounted by the manager and the trainer only;
- a worker's ack key is HMAC-SHA256(colocation.key, job, "reserved", worker id). The manager hands it to a
  worker registering in the reserved pool, in `Registered.colocation_ack_key`, over that worker's stream,
  whose worker id is bound to its session (rollout_manager/identity.py): a worker gets only its own id's key;
- the worker MACs each ack's fields with its key (`AckSigner`); the trainer derives the key from the ack's
  claimed worker id and checks the MAC (`AckVerifier`), refusing an ack without one or with a wrong one.

Spot workers get no key (only reserved workers are colocated with the trainer), so a spot worker cannot ack
even under its own id. Workers cannot subscribe to `colocation-acks` (rlboost.auth.nats_config), so they cannot
read another worker's ack; a MAC covers the step and action, so an old ack is no ack for another command.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from rlboost.wire.events import ColocationAck

MAC_MISSING, MAC_INVALID = "mac_missing", "mac_invalid"  # why an ack is refused (the trainer's metric label)
_RESERVED = "reserved"  # the pool whose workers are colocated: part of the derivation, so a spot key is no key


def worker_ack_key(colocation_key: bytes, job: str, worker_id: str) -> str:
    """The ack key (hex) of reserved worker `worker_id` of `job`: what the manager issues and the trainer derives."""
    if not colocation_key:
        raise ValueError("colocation key: must not be empty (the job's colocation.key)")
    message = "\0".join(("rlboost-colocation-ack", job, _RESERVED, worker_id)).encode()
    return hmac.new(colocation_key, message, hashlib.sha256).hexdigest()


def ack_mac(ack: ColocationAck, ack_key: str) -> str:
    """The MAC (hex) of every field of `ack` but `mac` under a worker's ack key; canonical JSON, so no two
    different acks share a message."""
    fields = json.dumps(ack.model_dump(exclude={"mac"}), sort_keys=True, separators=(",", ":"))
    return hmac.new(ack_key.encode(), fields.encode(), hashlib.sha256).hexdigest()


def sign(ack: ColocationAck, ack_key: str) -> ColocationAck:
    """`ack` with its MAC set (left empty without a key: a worker of a job without credentials)."""
    ack.mac = ack_mac(ack, ack_key) if ack_key else ""
    return ack


class AckVerifier:
    """The trainer's check: is an ack's MAC the one its claimed worker id's key makes?"""

    def __init__(self, colocation_key: bytes, job: str) -> None:
        worker_ack_key(colocation_key, job, "")  # an empty key fails here, at the start, not on the first ack
        self._key, self._job = colocation_key, job

    def refusal(self, ack: ColocationAck) -> str | None:
        """Why `ack` is not its worker's (MAC_MISSING, MAC_INVALID), or None when it is."""
        if not ack.mac:
            return MAC_MISSING
        key = worker_ack_key(self._key, self._job, ack.worker_id)  # no cache: any id may be claimed, memory stays flat
        if not hmac.compare_digest(ack.mac.encode(), ack_mac(ack, key).encode()):
            return MAC_INVALID  # forged, another worker's id, or fields changed after signing
        return None
