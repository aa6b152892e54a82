"""Fuzzing the manager's protobuf boundary (rlboost.wire.rollout_proto): what a worker or a trainer sends.

Raw bytes parse into a message or raise DecodeError; a message converts into a domain object or raises WireError
(the server turns it into INVALID_ARGUMENT) - never another exception. What converts is valid: the checks the
conversions document hold for every accepted object (non-empty ids, positive capacity and group size, matching
log-prob counts, non-negative offsets, finite sampling parameters, finite log-probs, non-negative token ids).
Example counts are bounded (FUZZ) so the suite stays fast.
"""

from __future__ import annotations

import math

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire import rollout_proto as wire

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
TEXT = st.text(max_size=20)


def _convert(convert, message):
    """The domain object, or None when the conversion refused it with WireError (the only error allowed)."""
    try:
        return convert(message)
    except wire.WireError as err:
        assert str(err)  # a message naming the field
        return None


def _sampling_ok(s) -> None:
    assert math.isfinite(s.temperature) and s.temperature >= 0
    assert math.isfinite(s.top_p) and 0 < s.top_p <= 1
    assert s.max_new_tokens > 0 and s.top_k >= 0
    assert all(t >= 0 for t in s.stop_token_ids)


sampling_pb = st.builds(
    pb.SamplingParams,
    temperature=F32,
    top_p=F32,
    top_k=I32,
    max_new_tokens=I32,
    seed=st.integers(0, 2**64 - 1),
    stop_token_ids=st.lists(I32, max_size=4),
)


@FUZZ
@given(st.binary(max_size=256), st.sampled_from([pb.WorkerMessage, pb.RolloutRequest, pb.Register, pb.TokenChunk]))
def test_raw_bytes_decode_or_raise_decode_error(data: bytes, kind) -> None:
    try:
        message = kind.FromString(data)
    except DecodeError:
        return
    converters = {
        pb.RolloutRequest: wire.rollout_request_from_pb,
        pb.Register: wire.registration_from_pb,
        pb.TokenChunk: wire.chunk_from_pb,
    }
    if kind is pb.WorkerMessage:
        if message.HasField("register"):
            _convert(wire.registration_from_pb, message.register)
        for chunk in message.chunks.chunks:
            _convert(wire.chunk_from_pb, chunk)
    else:
        _convert(converters[kind], message)


@FUZZ
@given(st.builds(pb.Register, worker_id=TEXT, pool=I32, node=TEXT, capacity=I32, weight_version=I64, engine=TEXT))
def test_registration(message: pb.Register) -> None:
    reg = _convert(wire.registration_from_pb, message)
    if reg is not None:
        assert reg.worker_id and reg.capacity > 0 and reg.engine


@FUZZ
@given(
    st.builds(
        pb.TokenChunk,
        request_id=TEXT,
        lease_epoch=I64,
        offset=I32,
        token_ids=st.lists(I32, max_size=8),
        logprobs=st.lists(F32, max_size=8),
        finished=st.booleans(),
        finish_reason=TEXT,
    )
)
def test_token_chunk(message: pb.TokenChunk) -> None:
    chunk = _convert(wire.chunk_from_pb, message)
    if chunk is not None:
        assert len(chunk.token_ids) == len(chunk.logprobs) and chunk.offset >= 0
        assert all(t >= 0 for t in chunk.token_ids)
        assert all(math.isfinite(p) for p in chunk.logprobs)


@FUZZ
@given(
    st.builds(
        pb.RolloutRequest,
        step=I64,
        weight_version=I64,
        group_size=I32,
        sampling=sampling_pb,
        prompts=st.lists(st.builds(pb.Prompt, prompt_index=I32, token_ids=st.lists(I32, max_size=4)), max_size=4),
    )
)
def test_rollout_request(message: pb.RolloutRequest) -> None:
    req = _convert(wire.rollout_request_from_pb, message)
    if req is not None:
        assert req.group_size > 0
        assert all(p.token_ids and all(t >= 0 for t in p.token_ids) for p in req.prompts)
        _sampling_ok(req.sampling)


@FUZZ
@given(sampling_pb)
def test_sampling(message: pb.SamplingParams) -> None:
    sampling = _convert(wire.sampling_from_pb, message)
    if sampling is not None:
        _sampling_ok(sampling)
