"""The typed table of a job's NATS topics (rlboost.wire.events): the subjects already on the wire, each topic's
payload type, and its encoding as the services have always sent it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlboost.wire.events import (
    COLOCATION,
    COLOCATION_ACKS,
    DONE,
    NODES,
    STEPS,
    TOPICS,
    WEIGHTS,
    ColocationAck,
    ColocationCommand,
    JobDone,
    PreemptionNotice,
    StepReport,
    SuspendRequest,
    WeightsAnnounced,
)


def test_each_topic_is_the_subject_on_the_wire_with_its_payload_type():
    table = {t.subject("ns", "job"): t.payload for t in TOPICS}
    assert table == {
        "rlboost.ns.job.weights": WeightsAnnounced,
        "rlboost.ns.job.nodes": PreemptionNotice,
        "rlboost.ns.job.steps": StepReport,
        "rlboost.ns.job.done": JobDone,
        "rlboost.ns.job.colocation": ColocationCommand,
        "rlboost.ns.job.colocation-acks": ColocationAck,
        "rlboost.ns.job.suspend": SuspendRequest,  # answered with a SuspendReply
    }
    assert STEPS.subject("*", "*") == "rlboost.*.*.steps"  # the operator's stream: every job's


def test_a_payload_goes_out_as_its_json_and_comes_back_typed():
    event = WeightsAnnounced(version=3, checksum="c", kind="delta")
    assert WEIGHTS.encode(event) == event.model_dump_json().encode()
    assert WEIGHTS.decode(WEIGHTS.encode(event)) == event
    assert DONE.decode(b'{"ok": true, "steps": 2}') == JobDone(ok=True, steps=2)
    with pytest.raises(ValidationError):
        NODES.decode(b'{"deadline_s": -1}')


def test_a_subject_is_known_by_its_topic_whatever_the_job():
    assert DONE.carries("rlboost.a.b.done") and not DONE.carries(STEPS.subject("a", "b"))
    assert COLOCATION_ACKS.carries("rlboost.x.y.colocation-acks") and not COLOCATION.carries(
        "rlboost.x.y.colocation-acks"
    )
