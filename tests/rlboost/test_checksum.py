"""rlboost.weights.checksum: the whole-state checksum (sha256 over a listing of per-tensor xxh3-64 digests).

Checked against a reference written here from the definition, bit sensitivity (every bit, NaN payloads, ±0),
what the listing binds (name, dtype, shape), the table-derived checksum after a real encode + apply_, and
that splitting the blocks over threads changes nothing.
"""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import rlboost.delta as rd
from rlboost.delta.format import DEFAULT_BLOCK_BYTES, parse
from rlboost.weights.checksum import (
    _split,
    checksum_of_listing,
    delta_state_checksum,
    legacy_state_checksum,
    state_checksum,
    tensor_bytes,
    tensor_checksums,
)

MIB = 1 << 20


def _reference(state: dict[str, torch.Tensor]) -> str:
    """The definition, written out plainly: one thread, blocks hashed in order, no shared code."""
    lines = []
    for name in sorted(state):
        t = state[name]
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        if len(raw) <= MIB:
            digest = xxhash.xxh3_64_intdigest(raw)
        else:
            blocks = [xxhash.xxh3_64_intdigest(raw[i : i + MIB]) for i in range(0, len(raw), MIB)]
            digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{len(blocks)}Q", *blocks))
        dtype = str(t.dtype).removeprefix("torch.")
        lines.append(f"{name}|{dtype}|{tuple(t.shape)}|{digest:016x}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(700, 1024, generator=g).to(torch.bfloat16),  # 1.4 MB: two blocks
        "layer.0.w": torch.randn(64, 48, generator=g).to(torch.float16),
        "layer.0.b": torch.randn(48, generator=g),
        "norm.scale": torch.tensor(1.5, dtype=torch.float32),  # 0-dim
        "positions": torch.arange(100, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
    }


def test_equals_the_reference_definition() -> None:
    state = _state()
    assert state_checksum(state) == _reference(state)
    assert state_checksum({}) == hashlib.sha256(b"").hexdigest()


def test_state_checksum_is_not_the_former_sha256_of_bytes() -> None:
    """Old checkpoints carry the former definition: it must never be mistaken for the new one."""
    state = _state()
    assert legacy_state_checksum(state) != state_checksum(state)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_one_flipped_bit_anywhere_changes_it(data) -> None:
    state = {
        "a": torch.arange(300_000, dtype=torch.int32).view(torch.float32),
        "b": torch.ones(3, dtype=torch.bfloat16),
    }
    base = state_checksum(state)
    name = data.draw(st.sampled_from(sorted(state)))
    raw = state[name].view(torch.uint8).reshape(-1)
    pos = data.draw(st.integers(0, raw.numel() - 1))
    bit = data.draw(st.integers(0, 7))
    raw[pos] ^= 1 << bit
    assert state_checksum(state) != base
    raw[pos] ^= 1 << bit
    assert state_checksum(state) == base


def test_nan_payloads_and_signed_zeros_are_distinct() -> None:
    """Raw bits, never values: -0.0 == +0.0 and NaN != NaN arithmetically, yet each pattern hashes apart."""
    zeros = state_checksum({"x": torch.tensor([0.0, 1.0])})
    assert state_checksum({"x": torch.tensor([-0.0, 1.0])}) != zeros
    nan_a = torch.tensor([0x7FC00000], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert torch.isnan(nan_a).all() and torch.isnan(nan_b).all()
    assert state_checksum({"x": nan_a}) != state_checksum({"x": nan_b})
    assert state_checksum({"x": nan_a}) == state_checksum({"x": nan_a.clone()})


def test_name_dtype_and_shape_are_bound() -> None:
    t = torch.arange(12, dtype=torch.int16)
    base = state_checksum({"w": t})
    assert state_checksum({"v": t}) != base  # name
    assert state_checksum({"w": t.view(torch.float16)}) != base  # dtype, same bytes
    assert state_checksum({"w": t.view(torch.bfloat16)}) != state_checksum({"w": t.view(torch.float16)})
    assert state_checksum({"w": t.reshape(3, 4)}) != base  # shape, same bytes
    assert state_checksum({"w": t.reshape(3, 4)}) != state_checksum({"w": t.reshape(4, 3)})
    # insertion order does not matter; a strided view hashes as its contiguous copy
    a, b = torch.ones(2), torch.zeros(3)
    assert state_checksum({"a": a, "b": b}) == state_checksum({"b": b, "a": a})
    m = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    assert state_checksum({"m": m.t()}) == state_checksum({"m": m.t().contiguous()})


def test_listing_of_entries_matches_the_state_checksum() -> None:
    state = _state()
    names = sorted(state)
    digests = tensor_checksums([tensor_bytes(state[n]) for n in names])
    entries = [
        (n, str(state[n].dtype).removeprefix("torch."), list(state[n].shape), d)
        for n, d in zip(names, digests, strict=True)
    ]
    assert checksum_of_listing(reversed(entries)) == state_checksum(state)


def _changed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A training step's kind of change: a few elements of some tensors, bit-level."""
    g = torch.Generator().manual_seed(seed)
    out = {k: v.clone() for k, v in state.items()}
    for name in ("embed.weight", "layer.0.b", "positions"):
        flat = out[name].view(-1)
        idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 100),), generator=g)
        flat[idx] = flat[idx] + 1
    return out


def test_table_checksum_equals_recomputed_after_a_real_encode_and_apply() -> None:
    """bf16, fp16, fp32 and int64 tensors; sparse, dense and unchanged entries; a 2-block tensor."""
    v0 = _state()
    v1 = _changed(v0, 1)
    v1["layer.0.w"] = torch.randn(64, 48, generator=torch.Generator().manual_seed(9)).to(torch.float16)  # dense
    blob = rd.encode(v0, v1, base_version=0, version=1)
    encodings = {e.name: e.encoding for e in parse(blob).tensors}
    assert {"sparse", "dense", "unchanged"} <= set(encodings.values())
    held = {k: v.clone() for k, v in v0.items()}
    rd.apply_(held, blob)
    from_table = delta_state_checksum(parse(blob))
    assert from_table == state_checksum(held) == state_checksum(v1) == _reference(v1)


def test_table_checksum_is_refused_for_another_hash_block() -> None:
    v0 = _state()
    blob = rd.encode(v0, _changed(v0, 2), base_version=0, version=1, block_bytes=DEFAULT_BLOCK_BYTES // 2)
    assert delta_state_checksum(parse(blob)) is None


@pytest.mark.parametrize("threads", [2, 3])
def test_multi_block_tensors_hash_the_same_on_one_or_more_threads(threads: int) -> None:
    g = torch.Generator().manual_seed(3)
    state = {
        "big": torch.randn(3 * MIB + 77, generator=g).to(torch.bfloat16),  # 6 MiB + 154 bytes: 7 blocks
        "mid": torch.randn(MIB // 2 + 3, generator=g),  # 2 MiB + 12: 3 blocks
        "small": torch.randn(5, generator=g),
        "zero": torch.zeros(0),
    }
    assert state_checksum(state, threads=threads) == state_checksum(state, threads=1) == _reference(state)
    runs = _split([len(tensor_bytes(state[n])) for n in sorted(state)], threads)
    assert len(runs) == threads and sum(stop - first for run in runs for _, first, stop in run) == 7 + 3 + 1
    assert any(
        r[-1][0] == q[0][0] for r, q in zip(runs, runs[1:], strict=False)
    )  # a tensor really was split between threads


def test_split_covers_every_block_once_in_order() -> None:
    sizes = [10, 5 * MIB, 3 * MIB, 0, 100, MIB, MIB + 1]
    for parts in (1, 2, 3, 7, 20):
        runs = _split(sizes, parts)
        flat = [(i, b) for run in runs for i, first, stop in run for b in range(first, stop)]
        want = [(i, b) for i, n in enumerate(sizes) for b in range(-(-n // MIB))]
        assert flat == want and len(runs) <= parts
