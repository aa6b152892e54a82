"""rlboost.weights.safetensors_io: a pulled snapshot (a bytearray) becomes tensors that are views of it, bit for
bit what safetensors' own loader gives, and a malformed payload is a ValueError naming the defect, never a
crash or a silently wrong tensor (fuzzed against safetensors itself)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load

from rlboost.weights.checksum import state_checksum
from rlboost.weights.safetensors_io import state_from_bytes, state_to_bytes

SPECIAL = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-40, 3.5])


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "bf16": SPECIAL.to(torch.bfloat16),
        "f16": SPECIAL.to(torch.float16),
        "f32": torch.randn(3, 5, generator=g),
        "f64": torch.randn(2, generator=g, dtype=torch.float64),
        "i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "i8": torch.tensor([-3, 4], dtype=torch.int8),
        "u8": torch.tensor([250, 1], dtype=torch.uint8),
        "flag": torch.tensor([True, False]),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "scalar": torch.tensor(2.5),
    }


def test_a_bytearray_becomes_views_bit_identical_to_safetensors_load() -> None:
    state = _state()
    raw = state_to_bytes(state)
    buf = bytearray(raw)
    views = state_from_bytes(buf)
    reference = load(raw)
    assert views.keys() == reference.keys()
    for name, t in views.items():
        assert (t.dtype, t.shape) == (reference[name].dtype, reference[name].shape), name
    assert state_checksum(views) == state_checksum(reference) == state_checksum(state)
    lo, hi = _address(buf), _address(buf) + len(buf)
    assert all(lo <= t.data_ptr() < hi for t in views.values() if t.numel())  # no copy
    views["f32"].view(-1)[0] = 123.0  # a view: writing it writes the buffer (the delta apply relies on it)
    assert state_from_bytes(bytearray(buf))["f32"].view(-1)[0] == 123.0


def _address(buf: bytearray) -> int:
    return torch.frombuffer(buf, dtype=torch.uint8).data_ptr()


def _payload(header: dict, data: bytes) -> bytearray:
    text = json.dumps(header).encode()
    return bytearray(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "ends past the 4 data bytes"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "8 bytes for shape"),
        ({"a": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed entry"),
        ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed entry"),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, "malformed entry"),
        ({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8, "malformed entry"),
        (  # two tensors over the same bytes
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            },
            b"\0" * 8,
            "starts at 0, expected 8",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8, "starts at 4, expected 0"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8, "cover 4 of 8"),
    ],
)
def test_malformed_payloads_are_refused_with_the_defect_named(header: dict, data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=f"not a valid safetensors payload: .*({match})"):
        state_from_bytes(_payload(header, data))


@pytest.mark.parametrize("raw", [b"", b"\x05\0\0\0\0\0\0\0{}", b"\xff" * 8 + b"{}", b"\x02\0\0\0\0\0\0\0[]"])
def test_truncated_or_non_object_headers_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="not a valid safetensors payload"):
        state_from_bytes(bytearray(raw))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_payloads_raise_value_error_or_match_safetensors(data: st.DataObject) -> None:
    """Random byte edits of a real payload: either a ValueError, or exactly what safetensors' loader reads."""
    raw = bytearray(state_to_bytes({"a": torch.arange(4, dtype=torch.float32), "b": SPECIAL.to(torch.bfloat16)}))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        ours = state_from_bytes(bytearray(raw))
    except ValueError:
        return
    assert state_checksum(ours) == state_checksum(load(bytes(raw)))
