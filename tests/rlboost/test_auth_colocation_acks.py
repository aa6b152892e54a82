"""rlboost.auth.colocation_acks: a worker's ack key is bound to its id and job, and an ack's MAC to its fields."""

from __future__ import annotations

import pytest

from rlboost.auth.colocation_acks import MAC_INVALID, MAC_MISSING, AckVerifier, sign, worker_ack_key
from rlboost.wire.events import ColocationAck

KEY, JOB = b"the-jobs-colocation-key", "alpha"


def _ack(worker_id: str = "reserved-0", **fields: object) -> ColocationAck:
    return ColocationAck(step=3, action="release", worker_id=worker_id, released=True, nbytes=10, **fields)


def test_each_worker_id_and_job_gets_its_own_key() -> None:
    keys = {worker_ack_key(KEY, j, w) for j in (JOB, "beta") for w in ("reserved-0", "reserved-1")}
    assert len(keys) == 4 and worker_ack_key(KEY, JOB, "reserved-0") == worker_ack_key(KEY, JOB, "reserved-0")
    assert worker_ack_key(b"another-key", JOB, "reserved-0") not in keys


def test_an_ack_signed_with_its_workers_key_is_accepted() -> None:
    ack = sign(_ack(), worker_ack_key(KEY, JOB, "reserved-0"))
    assert AckVerifier(KEY, JOB).refusal(ColocationAck.model_validate_json(ack.model_dump_json())) is None


def test_an_ack_in_another_workers_name_or_changed_or_unsigned_is_refused() -> None:
    verifier, mine = AckVerifier(KEY, JOB), worker_ack_key(KEY, JOB, "reserved-1")
    assert verifier.refusal(sign(_ack("reserved-0"), mine)) == MAC_INVALID  # reserved-1 acking as reserved-0
    changed = sign(_ack("reserved-1"), mine).model_copy(update={"step": 4})
    assert verifier.refusal(changed) == MAC_INVALID  # an ack of step 3 is none of step 4
    assert verifier.refusal(sign(_ack("reserved-1"), "")) == MAC_MISSING  # no key: no MAC
    assert AckVerifier(KEY, "beta").refusal(sign(_ack("reserved-1"), mine)) == MAC_INVALID  # another job's


def test_an_empty_key_is_refused_with_the_files_name() -> None:
    with pytest.raises(ValueError, match="colocation.key"):
        AckVerifier(b"", JOB)
