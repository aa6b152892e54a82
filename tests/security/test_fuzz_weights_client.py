"""Fuzzing what the weights client (rlboost.weights.client) reads from a weight-server: JSON bodies (manifests,
version lists, asset lists, error bodies) and payloads (safetensors snapshots; delta payloads are fuzzed in
tests/rlboost/test_delta_fuzz.py, whose decoder raises only DeltaError).

A body parses into the model or raises pydantic's ValidationError; an error body always becomes a
WeightServerError; a payload parses or raises ValueError - never another exception. What parses is valid: a
manifest's version and sizes are not negative, its chunks lie inside the payload and its digests are hex SHA-256,
so a hostile manifest cannot make `pull` allocate a negative buffer or write outside it.
"""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rlboost.weights.client import WeightServerError, _raise_status, parse_sync_plan
from rlboost.weights.safetensors_io import state_from_bytes, state_to_bytes
from rlboost.wire.weights_io import AssetList, Manifest, VersionList

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HEX64 = "0123456789abcdef" * 4
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


def _manifest_doc() -> st.SearchStrategy[dict]:
    """Manifests near valid ones: each field valid or arbitrary, so validation is exercised field by field."""
    chunk = st.fixed_dictionaries(
        {
            "index": st.integers(-2, 4),
            "offset": st.integers(-10, 100),
            "length": st.integers(-10, 100),
            "sha256": st.sampled_from([HEX64, "zz", ""]),
        }
    )
    return st.fixed_dictionaries(
        {
            "version": st.integers(-5, 10) | JSON,
            "kind": st.sampled_from(["full", "delta", "other"]),
            "checksum": st.text(max_size=8),
            "total_bytes": st.integers(-10, 100) | JSON,
            "sha256": st.sampled_from([HEX64, "nothex", HEX64.upper()]),
            "chunk_bytes": st.integers(-10, 100),
            "chunks": st.lists(chunk, max_size=4),
        },
        optional={"base_version": st.integers(-5, 10) | st.none(), "compacted": st.booleans(), "companion": JSON},
    )


def _valid_manifest(m: Manifest) -> None:
    assert m.version >= 0 and m.total_bytes >= 0 and m.chunk_bytes >= 0
    assert m.base_version is None or m.base_version >= 0
    assert all(len(d) == 64 and set(d) <= set("0123456789abcdef") for d in [m.sha256, *(c.sha256 for c in m.chunks)])
    assert all(c.index >= 0 and c.offset >= 0 and c.length >= 0 for c in m.chunks)
    assert all(c.offset + c.length <= m.total_bytes for c in m.chunks)


@FUZZ
@given(st.binary(max_size=200) | JSON.map(lambda d: json.dumps(d).encode()))
def test_arbitrary_bodies_parse_or_raise_validation_error(body: bytes) -> None:
    for model in (Manifest, VersionList, AssetList):
        try:
            parsed = model.model_validate_json(body)
        except ValidationError:
            continue
        if isinstance(parsed, Manifest):
            _valid_manifest(parsed)


@FUZZ
@given(
    st.binary(max_size=100)
    | JSON.map(lambda d: json.dumps(d).encode())
    | st.lists(_manifest_doc(), max_size=3).map(lambda docs: json.dumps(docs).encode())
)
def test_a_sync_plan_parses_or_raises_validation_error(body: bytes) -> None:
    """Found by fuzzing: a /sync answer that was not a list of objects raised TypeError / JSONDecodeError."""
    try:
        plan = parse_sync_plan(body)
    except ValidationError:
        return
    for manifest in plan:
        _valid_manifest(manifest)


@FUZZ
@given(_manifest_doc())
def test_a_manifest_is_accepted_only_when_valid(doc: dict) -> None:
    try:
        manifest = Manifest.model_validate_json(json.dumps(doc))
    except ValidationError:
        return
    _valid_manifest(manifest)


@FUZZ
@given(st.integers(400, 599), st.binary(max_size=100) | JSON.map(lambda d: json.dumps(d).encode()), st.text())
def test_an_error_body_always_becomes_a_weight_server_error(status: int, body: bytes, reason: str) -> None:
    with pytest.raises(WeightServerError) as err:
        _raise_status(status, body, reason)
    assert err.value.status == status


def _snapshot() -> bytes:
    g = torch.Generator().manual_seed(0)
    return state_to_bytes({"a": torch.randn(4, 3, generator=g), "b": torch.arange(5, dtype=torch.int64)})


SNAPSHOT = _snapshot()


@FUZZ
@given(st.data())
def test_a_mutated_snapshot_parses_or_raises_value_error(data: st.DataObject) -> None:
    buf = bytearray(SNAPSHOT)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] = data.draw(st.integers(0, 255))
    buf = buf[: data.draw(st.integers(0, len(buf)))]
    for payload in (buf, bytes(buf)):  # the zero-copy path (bytearray) and safetensors' own loader
        try:
            state = state_from_bytes(payload)
        except ValueError:
            continue
        assert all(isinstance(t, torch.Tensor) for t in state.values())


@FUZZ
@given(JSON, st.binary(max_size=64))
def test_a_forged_header_parses_or_raises_value_error(header: object, data: bytes) -> None:
    raw = json.dumps(header).encode()
    with contextlib.suppress(ValueError):  # the only error allowed
        state_from_bytes(bytearray(struct.pack("<Q", len(raw)) + raw + data))
