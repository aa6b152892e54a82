"""Fuzzing the delta decoder with hypothesis: mutated or truncated deltas only ever raise DeltaError.

Two layers: raw byte mutations (caught by lengths and checksums), and mutations re-signed with
valid checksums, so the table validation and the sparse stream decoder themselves are exercised.
Example counts are bounded so the suite stays fast. The delta hashes in the smallest blocks (4 KiB),
so the large tensor is several blocks and two segments, each with its own streams: the per-segment
decode, the threaded write, hash and rollback are attacked too.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
import xxhash
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlboost.delta as rd
from rlboost.delta import _apply_kernel
from rlboost.delta import format as fmt

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _state() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(8000, generator=g).bfloat16(), "f": torch.randn(40, generator=g), "z": torch.zeros(3)}
    new = {k: v.clone() for k, v in base.items()}
    new["w"][::37] = new["w"][::37] * 1.01
    new["f"] = torch.randn(40, generator=g)
    return base, new


BASE, NEW = _state()
BLOCK = fmt.MIN_BLOCK_BYTES
BLOB = rd.encode(BASE, NEW, base_version=0, version=1, block_bytes=BLOCK)
PARSED = fmt.parse(BLOB)
PAYLOAD_START = fmt.HEADER_SIZE + PARSED.header.table_len


TABLE_JSON = zstandard.ZstdDecompressor().decompress(bytes(BLOB[fmt.HEADER_SIZE : PAYLOAD_START]))


def packed(table: object) -> bytes:
    """A table as stored since format 4: one zstd frame of its JSON."""
    return zstandard.ZstdCompressor().compress(json.dumps(table).encode())


def resign(table: bytes, payload: bytes) -> bytes:
    """A delta with the given table and payload and a valid header checksum."""
    block = PARSED.header.hash_block_bytes
    prefix = struct.pack("<8sHHIqqQII", fmt.MAGIC, fmt.FORMAT_VERSION, 0, len(table), 0, 1, len(payload), block, 0)
    return prefix + struct.pack("<Q", xxhash.xxh3_64_intdigest(prefix + table)) + table + payload


def test_resigning_the_original_gives_a_delta_that_applies() -> None:
    """Guards the fuzzers below: a resigned delta must reach the decoder, not fail on its header."""
    table = bytes(BLOB[fmt.HEADER_SIZE : PAYLOAD_START])
    assert resign(table, bytes(PARSED.payload)) == BLOB
    target = {k: v.clone() for k, v in BASE.items()}
    rd.apply_(target, resign(table, bytes(PARSED.payload)))
    assert all(torch.equal(target[k].view(torch.uint8), NEW[k].view(torch.uint8)) for k in NEW)


def must_reject_or_apply_exactly(blob: bytes) -> None:
    target = {k: v.clone() for k, v in BASE.items()}
    try:
        rd.apply_(target, blob)
    except rd.DeltaError:
        for k in BASE:  # rejected: nothing half-applied
            assert torch.equal(target[k].view(torch.uint8), BASE[k].view(torch.uint8)), k
        return
    for k in NEW:  # accepted: then it must be exactly the target
        assert torch.equal(target[k].view(torch.uint8), NEW[k].view(torch.uint8)), k


@FUZZ
@given(st.data())
def test_raw_mutations_and_truncations_only_raise_delta_error(data: st.DataObject) -> None:
    blob = bytearray(BLOB)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    must_reject_or_apply_exactly(bytes(blob[:cut]))


@FUZZ
@given(st.data())
def test_resigned_payload_mutations_only_raise_delta_error(data: st.DataObject) -> None:
    """Payload bytes mutated and the payload checksums fixed: the zstd streams and decoded positions are attacked."""
    payload = bytearray(PARSED.payload)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    table = json.loads(TABLE_JSON)
    for e in table["tensors"]:
        e["payload_xxh3"] = fmt.tensor_checksum(bytes(payload[e["offset"] : e["offset"] + e["length"]]), BLOCK)
    must_reject_or_apply_exactly(resign(packed(table), bytes(payload)))


def _outcome(blob: bytes, compiled: bool) -> str | list[bytes]:
    """What applying `blob` gives on one path: the DeltaError's message, or the resulting bits."""
    target = {k: v.clone() for k, v in BASE.items()}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_apply_kernel, "AVAILABLE", compiled)
        try:
            rd.apply_(target, blob)
        except rd.DeltaError as e:
            return str(e)
    return [target[k].view(torch.uint8).numpy().tobytes() for k in sorted(target)]


@FUZZ
@given(st.data())
def test_compiled_segment_jobs_match_the_python_path_on_mutated_payloads(data: st.DataObject) -> None:
    """The compiled segment job (zstd from compiled code) and the Python path reject the same forged streams, and
    apply the rest identically. A segment the kernel rejects is decoded again in Python for the message, so the
    message must name the fault. (Which of two forged segments is reported first depends on the two threads.)"""
    assert _apply_kernel.AVAILABLE, "the zstandard build lacks the exported libzstd API the compiled path needs"
    payload = bytearray(PARSED.payload)
    for _ in range(data.draw(st.integers(1, 6))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    table = json.loads(TABLE_JSON)
    for e in table["tensors"]:
        e["payload_xxh3"] = fmt.tensor_checksum(bytes(payload[e["offset"] : e["offset"] + e["length"]]), BLOCK)
    blob = resign(packed(table), bytes(payload))
    compiled, python = _outcome(blob, True), _outcome(blob, False)
    if isinstance(compiled, str) or isinstance(python, str):
        assert isinstance(compiled, str) and isinstance(python, str), (compiled, python)
        assert "does not decode" not in compiled, compiled
    else:
        assert compiled == python


FIELDS = ["dtype", "shape", "encoding", "changed", "offset", "length", "segments", "name", "base_xxh3"]
SEGMENT_FIELDS = ["stop", "changed", "gap_planes", "streams"]
VALUES = st.one_of(
    st.integers(-(2**65), 2**65),
    st.text(max_size=12),
    st.lists(st.integers(-5, 5000), max_size=6),
    st.sampled_from(["sparse", "dense", "unchanged", "bfloat16", "float32", "complex128", None, 1.5, True]),
)


@FUZZ
@given(st.data())
def test_resigned_table_mutations_only_raise_delta_error(data: st.DataObject) -> None:
    table = json.loads(TABLE_JSON)
    for _ in range(data.draw(st.integers(1, 3))):
        entry = data.draw(st.sampled_from(table["tensors"]))
        # A sparse entry's segments (format 3), unless an earlier draw replaced them with something else.
        segments = [s for s in entry["segments"] if isinstance(s, dict)] if isinstance(entry["segments"], list) else []
        if segments and data.draw(st.booleans()):
            segment = data.draw(st.sampled_from(segments))
            segment[data.draw(st.sampled_from(SEGMENT_FIELDS))] = data.draw(VALUES)
        else:
            entry[data.draw(st.sampled_from(FIELDS))] = data.draw(VALUES)
    payload = bytes(PARSED.payload)
    must_reject_or_apply_exactly(resign(packed(table), payload))
    try:
        rd.inspect(resign(packed(table), payload))
        rd.compose(BLOB, resign(packed(table), payload))
    except rd.DeltaError:
        pass
