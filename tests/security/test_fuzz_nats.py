"""Fuzzing what every NATS subscriber parses (payloads in rlboost.wire.events), and what it does next with a
parsed message where that is a pure function:

- rollout-manager: `nodes` (PreemptionNotice) through rollout_manager.preemption.handle_notice;
- rollout-worker: `weights` (WeightsAnnounced) and `colocation` (ColocationCommand);
- trainer: `colocation-acks` (ColocationAck);
- operator: `steps` (StepReport) and `done` (JobDone) into the RLJob status patch (status.step_status,
  status.done_status), which must be strict JSON (the API server refuses NaN / Infinity);
- `rlboost local`: `steps` and `done`.

A payload parses or raises pydantic's ValidationError (each subscriber catches exactly that, or ValueError, its
base); nothing else comes out. What parses is valid: versions, steps and counts not negative, a deadline finite.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from rlboost.spec import JobSpec
from rlboost.wire.events import (
    ColocationAck,
    ColocationCommand,
    JobDone,
    PreemptionNotice,
    StepReport,
    WeightsAnnounced,
)
from rlboost_operator import status
from rollout_manager.preemption import handle_notice

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
MODELS = [PreemptionNotice, WeightsAnnounced, ColocationCommand, ColocationAck, StepReport, JobDone]
SAMPLES: dict[type[BaseModel], dict] = {
    PreemptionNotice: {"node": "n1", "workers": ["w1"], "reason": "spot", "deadline_s": 30.0},
    WeightsAnnounced: {"version": 3, "checksum": "abc", "kind": "delta"},
    ColocationCommand: {"step": 1, "action": "release", "weight_version": 1},
    ColocationAck: {"step": 1, "action": "release", "worker_id": "w1", "released": True},
    StepReport: {
        "step": 0,
        "weight_version": 1,
        "weights_checksum": "c",
        "reward_mean": 0.5,
        "tokens": 10,
        "rollout_seconds": 1.0,
        "train_seconds": 1.0,
        "sync_seconds": 0.5,
    },
    JobDone: {"ok": True, "steps": 3},
}
# Literal JSON numbers a hostile publisher may write; Python's json reads NaN/Infinity, so pydantic may too.
ODD_NUMBERS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1", "-0.0", "1e30", "9" * 30])


def _parse(model: type[BaseModel], payload: bytes) -> BaseModel | None:
    try:
        return model.model_validate_json(payload)
    except ValidationError:
        return None


def _valid(msg: BaseModel) -> None:
    """What a subscriber may rely on in an accepted message."""
    for name in ("version", "step", "steps", "weight_version", "tokens", "nbytes"):
        value = getattr(msg, name, 0)
        assert value >= 0, (name, value)
    if isinstance(msg, PreemptionNotice):
        assert math.isfinite(msg.deadline_s) and msg.deadline_s >= 0
    if isinstance(msg, ColocationAck):
        assert math.isfinite(msg.seconds) and msg.seconds >= 0


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[type[BaseModel], bytes]:
    """A valid payload with one field replaced by arbitrary JSON or an odd number literal (written raw)."""
    model = draw(st.sampled_from(MODELS))
    doc = dict(SAMPLES[model])
    field = draw(st.sampled_from([*model.model_fields]))
    if draw(st.booleans()):
        doc[field] = draw(JSON)
        return model, json.dumps(doc).encode()
    doc[field] = "@@"
    return model, json.dumps(doc).replace('"@@"', draw(ODD_NUMBERS)).encode()


@FUZZ
@given(st.sampled_from(MODELS), st.binary(max_size=120) | JSON.map(lambda d: json.dumps(d).encode()))
def test_arbitrary_payloads_parse_or_raise_validation_error(model: type[BaseModel], payload: bytes) -> None:
    msg = _parse(model, payload)
    if msg is not None:
        _valid(msg)


@FUZZ
@given(near_valid())
def test_near_valid_payloads_are_accepted_only_when_valid(case: tuple[type[BaseModel], bytes]) -> None:
    msg = _parse(*case)
    if msg is not None:
        _valid(msg)


@FUZZ
@given(st.binary(max_size=120) | near_valid().map(lambda case: case[1]))
def test_the_manager_drains_only_on_a_valid_notice(payload: bytes) -> None:
    calls = []
    handle_notice(payload, lambda node, workers, reason: calls.append((node, workers, reason)) or workers)
    for node, workers, reason in calls:
        assert isinstance(node, str) and isinstance(reason, str) and all(isinstance(w, str) for w in workers)


@FUZZ
@given(near_valid().filter(lambda case: case[0] in (StepReport, JobDone)))
def test_the_operator_status_patch_is_strict_json(case: tuple[type[BaseModel], bytes]) -> None:
    msg = _parse(*case)
    if msg is None:
        return
    now = datetime(2026, 11, 23, tzinfo=UTC)
    if isinstance(msg, StepReport):
        patch = status.step_status(msg, JobSpec(), {"reserved": 1, "spot": 2}, {}, now)
    else:
        patch = status.done_status(msg, {}, now)
    json.dumps(patch, allow_nan=False)  # ValueError here: the API server would refuse the patch


def test_a_step_report_with_non_finite_seconds_is_refused_at_parse():
    """Found by the status-patch fuzz test: `rollout_seconds: Infinity` parsed and crashed the operator's time-left
    estimate; durations are measured, so a non-finite one is a malformed report (a NaN loss stays reportable)."""
    base = b'"step": 0, "weight_version": 1, "weights_checksum": "c", "reward_mean": NaN, "tokens": 10, '
    for seconds in (b"Infinity", b"NaN"):
        bad = b"{" + base + b'"rollout_seconds": ' + seconds + b', "train_seconds": 1.0, "sync_seconds": 0.5}'
        assert _parse(StepReport, bad) is None
    good = b"{" + base + b'"rollout_seconds": 2.0, "train_seconds": 1.0, "sync_seconds": 0.5}'
    assert _parse(StepReport, good) is not None
