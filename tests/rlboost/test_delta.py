"""Tests of the sparse, bit-exact delta codec (rlboost.delta) and its CLI (real subprocesses, real files)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
import zstandard
from safetensors.torch import load_file, save_file

import rlboost.delta as rd
from rlboost.delta import format as fmt
from rlboost.delta._scan import changed_positions, scan_pair

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def ref_checksum(a: np.ndarray, block: int = fmt.DEFAULT_BLOCK_BYTES) -> int:
    """The format's tensor checksum written out independently: xxh3 of the bytes, or of the blocks' digests."""
    raw = a.tobytes()
    if len(raw) <= block:
        return xxhash.xxh3_64_intdigest(raw)
    digests = [xxhash.xxh3_64_intdigest(raw[i : i + block]) for i in range(0, len(raw), block)]
    return xxhash.xxh3_64_intdigest(np.array(digests, dtype="<u8").tobytes())


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(INT_VIEW[t.element_size()])


def assert_bit_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert torch.equal(bits(a[name]), bits(b[name])), f"{name} differs in its bit patterns"


def specials(dtype: torch.dtype) -> torch.Tensor:
    """±0, ±inf, NaNs with distinct payloads, subnormals, max/min of the type, as raw bit patterns."""
    width = torch.finfo(dtype).bits
    if width == 16 and dtype == torch.bfloat16:
        pats = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFFF, 0x7F81, 0x0001, 0x8001, 0x007F, 0x7F7F]
    elif width == 16:
        pats = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7E01, 0xFFFF, 0x7C01, 0x0001, 0x8001, 0x03FF, 0x7BFF]
    else:
        pats = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0xFFFFFFFF, 0x7F800001, 1, 0x80000001]
    ints = torch.tensor([p - (1 << width) if p >= 1 << (width - 1) else p for p in pats], dtype=INT_VIEW[width // 8])
    return ints.view(dtype)


def rl_state(seed: int = 0, n: int = 50_000) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A small state with ~1% of elements nudged by one ulp, plus special values, in every float dtype."""
    g = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        b = (torch.randn(n, generator=g) * 0.02).to(dtype)
        b[: len(specials(dtype))] = specials(dtype)
        ints = bits(b).clone()
        pick = torch.randperm(n, generator=g)[: n // 100]
        ints[pick] += torch.where(torch.rand(pick.numel(), generator=g) < 0.5, 1, -1).to(ints.dtype)
        ints[3] = bits(specials(dtype))[5]  # one NaN payload changes into another
        name = str(dtype).removeprefix("torch.")
        base[f"{name}.w"], new[f"{name}.w"] = b.reshape(100, -1), ints.view(dtype).reshape(100, -1)
    base["step"] = torch.tensor(7, dtype=torch.int64)
    new["step"] = torch.tensor(8, dtype=torch.int64)
    base["mask"] = torch.zeros(33, dtype=torch.bool)
    new["mask"] = base["mask"].clone()
    return base, new


def test_round_trip_is_bit_exact_for_every_dtype_and_special_value() -> None:
    base, new = rl_state()
    blob = rd.encode(base, new, base_version=4, version=5)
    assert_bit_identical(rd.apply(base, blob), new)
    info = rd.inspect(blob)
    assert (info.base_version, info.version, info.format_version) == (4, 5, rd.FORMAT_VERSION)
    enc = {t.name: t.encoding for t in info.tensors}
    assert enc == {
        "bfloat16.w": "sparse",
        "float16.w": "sparse",
        "float32.w": "sparse",
        "step": "dense",
        "mask": "unchanged",
    }
    bf16 = next(t for t in info.tensors if t.name == "bfloat16.w")
    assert bf16.changed == 501 and bf16.bytes_per_changed < 2.0


def test_special_values_overwrite_each_other_exactly() -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        s = specials(dtype)
        base, new = {"x": s}, {"x": s.flip(0).contiguous()}  # every special becomes another special
        assert_bit_identical(rd.apply(base, rd.encode(base, new, base_version=0, version=1)), new)


def test_other_dtypes_and_shapes_round_trip() -> None:
    g = torch.Generator().manual_seed(1)
    base = {
        "i8": torch.randint(-128, 127, (7, 3), dtype=torch.int8, generator=g),
        "i32": torch.randint(-(2**31), 2**31 - 1, (1001,), dtype=torch.int32, generator=g),
        "f64": torch.randn(5, 5, dtype=torch.float64, generator=g),
        "empty": torch.empty(0, 4),
        "scalar": torch.tensor(1.5),
        "odd": torch.randn(13, generator=g).bfloat16(),  # length not a multiple of the 4-lane word
    }
    new = {k: v.clone() for k, v in base.items()}
    new["i8"][2, 1] = -new["i8"][2, 1] - 1
    new["i32"][1000] = 2**31 - 1 if base["i32"][1000] != 2**31 - 1 else 0
    new["f64"][4, 4] = float("-inf")
    new["scalar"].fill_(-0.0)
    new["odd"][12] = float("nan")
    blob = rd.encode(base, new, base_version=0, version=1)
    assert_bit_identical(rd.apply(base, blob), new)


def test_dense_fallback_when_sparse_would_be_larger() -> None:
    g = torch.Generator().manual_seed(2)
    base = {"w": torch.randn(4096, generator=g).bfloat16()}
    new = {"w": torch.randn(4096, generator=g).bfloat16()}  # every element changes, randomly
    blob = rd.encode(base, new, base_version=0, version=1)
    (t,) = rd.inspect(blob).tensors
    assert t.encoding == "dense" and t.bytes == 4096 * 2 and t.changed > 4000
    assert_bit_identical(rd.apply(base, blob), new)


def test_unchanged_state_has_no_payload() -> None:
    base, _ = rl_state()
    blob = rd.encode(base, base, base_version=1, version=2)
    info = rd.inspect(blob)
    assert info.changed == 0 and all(t.encoding == "unchanged" and t.bytes == 0 for t in info.tensors)
    assert_bit_identical(rd.apply(base, blob), base)


def test_apply_in_place_and_base_untouched_by_apply() -> None:
    base, new = rl_state()
    keep = {k: v.clone() for k, v in base.items()}
    blob = rd.encode(base, new, base_version=0, version=1)
    rd.apply(base, blob)
    assert_bit_identical(base, keep)
    target = {k: v.clone() for k, v in base.items()}
    ptrs = {k: v.data_ptr() for k, v in target.items()}
    rd.apply_(target, blob, verify_target=True)
    assert_bit_identical(target, new)
    assert {k: v.data_ptr() for k, v in target.items()} == ptrs  # written in place, not replaced


def test_apply_in_place_into_non_contiguous_tensor() -> None:
    g = torch.Generator().manual_seed(3)
    big = torch.randn(64, 64, generator=g).bfloat16()
    view = big.t()  # non-contiguous: goes through a CPU copy and is written back
    new = {"w": view.contiguous().clone()}
    new["w"][5, 7] = 1.0
    blob = rd.encode({"w": view}, new, base_version=0, version=1)
    rd.apply_({"w": view}, blob)
    assert torch.equal(bits(view), bits(new["w"])) and big[7, 5].item() == 1.0


def test_compose_equals_direct_delta_in_effect() -> None:
    base, mid = rl_state(seed=0)
    g = torch.Generator().manual_seed(9)
    last = {k: v.clone() for k, v in mid.items()}
    ints = bits(last["bfloat16.w"])
    ints[torch.randperm(ints.numel(), generator=g)[:400]] += 1
    ints[bits(mid["bfloat16.w"]) != bits(base["bfloat16.w"])] = bits(base["bfloat16.w"])[
        bits(mid["bfloat16.w"]) != bits(base["bfloat16.w"])
    ]  # undo some a->b changes: they must cancel in a->c
    last["float32.w"] = torch.randn(100, 500, generator=g)  # dense in b->c
    last["step"] = torch.tensor(9)
    d_ab = rd.encode(base, mid, base_version=0, version=1)
    d_bc = rd.encode(mid, last, base_version=1, version=2)
    d_ac = rd.compose(d_ab, d_bc)
    info, direct = rd.inspect(d_ac), rd.inspect(rd.encode(base, last, base_version=0, version=2))
    assert (info.base_version, info.version) == (0, 2)
    assert_bit_identical(rd.apply(base, d_ac), last)
    by_name = {t.name: t for t in info.tensors}
    assert by_name["bfloat16.w"].changed == next(t.changed for t in direct.tensors if t.name == "bfloat16.w")
    assert by_name["float32.w"].encoding == "dense"
    assert_bit_identical(rd.apply(base, rd.compose_chain([d_ab, d_bc])), last)


def test_compose_dense_then_sparse_and_revert_to_unchanged() -> None:
    g = torch.Generator().manual_seed(4)
    a = {"w": torch.randn(256, generator=g).bfloat16(), "v": torch.zeros(64)}
    b = {"w": torch.randn(256, generator=g).bfloat16(), "v": torch.zeros(64)}  # dense a->b for w
    b["v"][3] = 1.0  # sparse a->b for v ...
    c = {"w": b["w"].clone(), "v": torch.zeros(64)}  # ... and back: the two differences cancel
    c["w"][0] = 3.0
    d_ac = rd.compose(rd.encode(a, b, base_version=0, version=1), rd.encode(b, c, base_version=1, version=2))
    info = {t.name: t for t in rd.inspect(d_ac).tensors}
    assert info["w"].encoding == "dense" and info["v"].encoding == "unchanged"
    assert_bit_identical(rd.apply(a, d_ac), c)


def test_compose_rejects_a_broken_chain() -> None:
    base, new = rl_state()
    d_ab = rd.encode(base, new, base_version=0, version=1)
    with pytest.raises(rd.DeltaError, match="produces version 1"):
        rd.compose(d_ab, rd.encode(base, new, base_version=5, version=6))
    with pytest.raises(rd.DeltaError, match="base is not the first delta's target"):
        rd.compose(d_ab, rd.encode(base, new, base_version=1, version=2))  # right number, wrong weights


def test_compose_needs_no_torch(tmp_path: Path) -> None:
    """The weight-server composes and inspects deltas without torch (checked in a fresh interpreter)."""
    base, new = rl_state()
    del base["step"], new["step"]  # dense both ways: a composed dense entry's `changed` is only a bound
    (tmp_path / "ab").write_bytes(rd.encode(base, new, base_version=0, version=1))
    (tmp_path / "ba").write_bytes(rd.encode(new, base, base_version=1, version=2))
    code = (
        "import sys, pathlib, rlboost.delta as rd; r = lambda p: pathlib.Path(p).read_bytes(); "
        "i = rd.inspect(rd.compose(r(sys.argv[1]), r(sys.argv[2]))); "
        "assert 'torch' not in sys.modules, 'torch was imported'; print(i.changed, i.version)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ab"), str(tmp_path / "ba")], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "2"]  # a->b->a composes to no change at all


# ---------------------------------------------------------------- bad input


def corruptions(blob: bytes) -> dict[str, bytes]:
    """One example of every corruption class."""
    d = fmt.parse(blob)
    payload_start = fmt.HEADER_SIZE + d.header.table_len
    first_payload = next(e for e in d.tensors if e.length)
    flip_payload = bytearray(blob)
    flip_payload[payload_start + first_payload.offset + first_payload.length // 2] ^= 0x40
    flip_table = bytearray(blob)
    flip_table[fmt.HEADER_SIZE + 5] ^= 0x01
    return {
        "truncated header": blob[:20],
        "truncated payload": blob[:-1],
        "trailing bytes": blob + b"\0",
        "bad magic": b"XXXXXXXX" + blob[8:],
        "future format version": blob[:8] + struct.pack("<H", 99) + blob[10:],
        "corrupted table": bytes(flip_table),
        "corrupted payload": bytes(flip_payload),
        "empty": b"",
    }


def test_every_corruption_is_rejected_and_nothing_is_applied() -> None:
    base, new = rl_state()
    blob = rd.encode(base, new, base_version=0, version=1)
    for kind, bad in corruptions(blob).items():
        target = {k: v.clone() for k, v in base.items()}
        with pytest.raises(rd.DeltaError):
            rd.apply_(target, bad)
        assert_bit_identical(target, base), kind
        with pytest.raises(rd.DeltaError):
            rd.inspect(bad) if kind != "corrupted payload" else rd.apply(base, bad)


def test_wrong_base_shape_dtype_and_names_are_rejected_before_any_write() -> None:
    base, new = rl_state()
    blob = rd.encode(base, new, base_version=0, version=1)
    wrong_base = {k: v.clone() for k, v in new.items()}  # the right names, shapes, dtypes; wrong weights
    wrong_base["mask"] = base["mask"].clone()
    cases = {
        "wrong base": (wrong_base, "not version 0"),
        "wrong shape": ({**base, "float32.w": base["float32.w"].reshape(500, 100)}, "shape"),
        "wrong dtype": ({**base, "float32.w": base["float32.w"].double()}, "dtype"),
        "missing tensor": ({k: v for k, v in base.items() if k != "step"}, "missing 'step'"),
        "extra tensor": ({**base, "extra": torch.zeros(1)}, "extra 'extra'"),
    }
    for kind, (state, msg) in cases.items():
        target = {k: v.clone() for k, v in state.items()}
        with pytest.raises(rd.DeltaError, match=msg):
            rd.apply_(target, blob)
        assert_bit_identical(target, state), kind


def test_encode_rejects_mismatched_states() -> None:
    base, new = rl_state()
    with pytest.raises(rd.DeltaError, match="shape"):
        rd.encode(base, {**new, "step": torch.zeros(2, dtype=torch.int64)}, base_version=0, version=1)
    with pytest.raises(rd.DeltaError, match="dtype"):
        rd.encode(base, {**new, "step": torch.tensor(8.0)}, base_version=0, version=1)
    with pytest.raises(rd.DeltaError, match="unsupported dtype"):
        rd.encode(
            {"c": torch.zeros(2, dtype=torch.complex128)},
            {"c": torch.ones(2, dtype=torch.complex128)},
            base_version=0,
            version=1,
        )


def test_scanner_matches_numpy_reference_on_every_width() -> None:
    rng = np.random.default_rng(5)
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        for n in (0, 1, 3, 63, 64, 65, 1000, 300_001):
            a = rng.integers(0, 255, n * np.dtype(dt).itemsize, dtype=np.uint8).view(dt)
            b = a.copy()
            flip = rng.random(n) < 0.02
            b[flip] ^= dt(1 << (8 * np.dtype(dt).itemsize - 1))  # a high bit: every lane position is covered
            np.testing.assert_array_equal(changed_positions(a, b), np.flatnonzero(a != b))
    assert changed_positions(a, ~a, limit=10) is None


def test_scanner_grows_its_buffers_and_counts_past_the_limit() -> None:
    rng = np.random.default_rng(6)
    a = rng.integers(0, 1 << 16, 1_000_003, dtype=np.uint16)
    b = a.copy()
    flip = rng.random(a.size) < 0.2  # more changes than the first buffer holds: it must grow
    b[flip] += np.uint16(1)
    found = scan_pair(a, b, limit=a.size // 4)
    np.testing.assert_array_equal(found.idx, np.flatnonzero(flip))
    np.testing.assert_array_equal(found.diff, np.ones(flip.sum(), dtype=np.uint16))
    assert found.base_xxh3 == ref_checksum(a) and found.target_xxh3 == ref_checksum(b)
    past = scan_pair(a, b, limit=1000)  # past the limit only the count is kept
    assert past.idx is None and past.changed == int(flip.sum())


def _reference_streams(old: np.ndarray, new: np.ndarray) -> tuple[list[bytes], int]:
    """One segment's streams computed the slow, obvious way with numpy (the layout in format.py): positions
    counted from the segment's start (old and new are the segment's slices)."""
    idx = np.flatnonzero(old != new)
    if not idx.size:
        return [], 0
    gaps = np.diff(idx, prepend=-1).astype(np.uint64) - np.uint64(1)
    planes = max(1, (int(gaps.max()).bit_length() + 7) // 8)
    diff = new[idx] - old[idx]
    sign = (diff.view(np.int16) >> 15).view(np.uint16)
    zz = (diff << np.uint16(1)) ^ sign
    raw = [gaps.view(np.uint8).reshape(-1, 8)[:, j] for j in range(planes)]
    raw += [zz.view(np.uint8).reshape(-1, 2)[:, j] for j in range(2)]
    params = zstandard.ZstdCompressionParameters(compression_level=1, min_match=7, strategy=zstandard.STRATEGY_FAST)
    cctx = zstandard.ZstdCompressor(compression_params=params)  # the documented encoder settings
    frames = [cctx.compress(np.ascontiguousarray(r).tobytes()) for r in raw]
    # Format 4: a plane zstd does not make smaller is stored raw (its stream is exactly the plane's length).
    return [
        f if len(f) < r.size else np.ascontiguousarray(r).tobytes() for f, r in zip(frames, raw, strict=True)
    ], planes


def test_encoder_output_is_the_documented_layout_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segment by segment (one segment with 1 MiB blocks, several with 4 KiB ones and 64 KiB segments: no tensor
    here is a large enough share of the state to be split for the threads), the payload is the reference
    streams, the segments tile the tensor on block boundaries, and the counts and lengths add up."""
    from rlboost.delta import codec

    monkeypatch.setattr(codec, "_SEGMENT_BYTES", 16 * SMALL)
    base, new = rl_state(n=400_000)
    old_bits = bits(base["bfloat16.w"]).numpy().view(np.uint16)
    new_bits = bits(new["bfloat16.w"]).numpy().view(np.uint16)
    for block, segments in ((fmt.DEFAULT_BLOCK_BYTES, 1), (SMALL, 2)):
        d = fmt.parse(rd.encode(base, new, base_version=0, version=1, block_bytes=block))
        entry = next(e for e in d.tensors if e.name == "bfloat16.w")
        assert entry.encoding == "sparse" and len(entry.segments) >= segments
        payload = d.payload_of(entry)
        for sp in entry.spans():
            assert sp.start % (block // 2) == 0
            streams, planes = _reference_streams(old_bits[sp.start : sp.stop], new_bits[sp.start : sp.stop])
            assert (sp.seg.gap_planes, sp.seg.streams) == (planes, [len(x) for x in streams])
            assert bytes(payload[sp.offset : sp.offset + sp.seg.length]) == b"".join(streams)
        assert entry.segments[-1].stop == old_bits.size and sum(x.length for x in entry.segments) == entry.length
        assert entry.base_xxh3 == ref_checksum(old_bits, block)
        assert entry.target_xxh3 == ref_checksum(new_bits, block)


def test_apply_without_target_verification_is_still_exact() -> None:
    base, new = rl_state()
    blob = rd.encode(base, new, base_version=0, version=1)
    target = {k: v.clone() for k, v in base.items()}
    rd.apply_(target, blob, verify_target=False)
    assert_bit_identical(target, new)


def test_bench_profile_and_many_tensors_run_in_process() -> None:
    from rlboost.delta import bench

    result = bench.run(elements=300_000, repeat=1, tensors=3)
    assert result["bit_exact"] is True and 0.001 < result["changed_fraction"] < 0.05
    rows = bench.profile(elements=300_000, repeat=1)
    stages = {r["stage"] for r in rows}
    assert {s.split(" (")[0] for s in stages} >= {"encode: total", "apply: total", "reference: numpy copy"}
    assert all("thread" in s for s in stages if not s.startswith("reference")), "every stage says its threads"
    assert all(r["wall_ms"] >= 0 and r["gb_per_s_wall"] > 0 for r in rows)


# ---------------------------------------------------------------- block-wise checksums (format 2)

SMALL = fmt.MIN_BLOCK_BYTES  # 4 KiB blocks: small tensors span many blocks and split into segments


def multi_block_pair() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Tensors of many 4 KiB blocks (one dense): changes at both sides of every block boundary, specials too."""
    g = torch.Generator().manual_seed(11)
    base = {
        "bf16": (torch.randn(50_001, generator=g) * 0.02).bfloat16(),  # not a whole number of blocks
        "f32": torch.randn(3000, generator=g),
        "dense": torch.randn(5000, generator=g),
    }
    new = {k: v.clone() for k, v in base.items()}
    ints = bits(new["bf16"])
    edges = torch.arange(2048, ints.numel(), 2048)  # 2048 bf16 elements per block
    ints[edges] += 1
    ints[edges - 1] -= 1
    ints[0], ints[-1] = bits(specials(torch.bfloat16))[4], bits(specials(torch.bfloat16))[1]
    bits(new["f32"])[::97] += 3
    new["dense"] = torch.randn(5000, generator=g)
    return base, new


def test_multi_block_tensors_round_trip_with_block_wise_checksums() -> None:
    base, new = multi_block_pair()
    blob = rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL)
    d = fmt.parse(blob)
    assert d.header.hash_block_bytes == SMALL
    assert {e.name: e.encoding for e in d.tensors} == {"bf16": "sparse", "f32": "sparse", "dense": "dense"}
    for e in d.tensors:
        assert e.base_xxh3 == ref_checksum(bits(base[e.name]).numpy(), SMALL), e.name
        assert e.target_xxh3 == ref_checksum(bits(new[e.name]).numpy(), SMALL), e.name
        assert e.payload_xxh3 == ref_checksum(np.frombuffer(d.payload_of(e), dtype=np.uint8), SMALL), e.name
    assert rd.tensor_checksum(bits(new["bf16"]).numpy(), SMALL) == d.tensors[0].target_xxh3
    assert_bit_identical(rd.apply(base, blob), new)
    for verify in (True, False):
        target = {k: v.clone() for k, v in base.items()}
        rd.apply_(target, blob, verify_target=verify)
        assert_bit_identical(target, new)


def test_changes_in_only_one_segment_and_long_gaps_across_segments() -> None:
    """A segment without changes has no streams; the first gap of the next counts from its start (two gap planes
    here: the change lies more than 255 elements into its segment)."""
    g = torch.Generator().manual_seed(12)
    base = {"late": torch.randn(40_000, generator=g).bfloat16(), "early": torch.randn(40_000, generator=g).bfloat16()}
    new = {k: v.clone() for k, v in base.items()}
    bits(new["late"])[[39_000, 39_999]] += 1  # only the last segment, the first gap spans the others
    bits(new["early"])[[0, 7, 300]] -= 1  # only the first segment
    blob = rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL)
    entries = {e.name: e for e in fmt.parse(blob).tensors}
    late = entries["late"].spans()
    assert entries["late"].encoding == "sparse" and [s.seg.changed for s in late] == [0, 2]
    assert late[1].seg.gap_planes == 2 and late[1].start < 39_000 - 256  # gaps count from the segment's start
    assert entries["early"].changed == 3
    assert_bit_identical(rd.apply(base, blob), new)


def test_wrong_base_in_the_last_block_is_rolled_back_in_every_segment() -> None:
    """The mismatch is in the last block: the other segment has already been written and must be undone too."""
    base, new = multi_block_pair()
    blob = rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL)
    wrong = {k: v.clone() for k, v in base.items()}
    bits(wrong["bf16"])[-5] ^= 1
    target = {k: v.clone() for k, v in wrong.items()}
    with pytest.raises(rd.DeltaError, match="'bf16'.*not version 0"):
        rd.apply_(target, blob)
    assert_bit_identical(target, wrong)


ZERO_CHANGES = [bytes([0, 0]), bytes(2), bytes(2)]  # one gap plane and two value planes: two zero differences


def _forged_segment(stop: int) -> tuple[fmt.SegmentEntry, bytes]:
    """A bf16 segment whose streams pass every check but decode to two changes that change nothing."""
    cctx = zstandard.ZstdCompressor(level=1)
    streams = [cctx.compress(x) for x in ZERO_CHANGES]
    return fmt.SegmentEntry(stop=stop, changed=2, gap_planes=1, streams=[len(x) for x in streams]), b"".join(streams)


def _repack(d: fmt.Delta, name: str, segments: list[fmt.SegmentEntry], payload: bytes) -> bytes:
    """`d` with tensor `name` made sparse with these segments and payload, every offset and checksum fixed."""
    entries, parts, offset = [], [], 0
    for e in d.tensors:
        p = payload if e.name == name else bytes(d.payload_of(e))
        if e.name == name:
            changed = sum(s.changed for s in segments)
            e = e.model_copy(update={"encoding": "sparse", "changed": changed, "segments": segments})
        e = e.model_copy(update={"offset": offset, "length": len(p)})
        entries.append(e.model_copy(update={"payload_xxh3": fmt.tensor_checksum(p, d.block_bytes)}))
        parts.append(p)
        offset += len(p)
    return fmt.pack(0, 1, entries, parts, d.block_bytes)


def test_forged_payload_of_a_later_tensor_rolls_back_the_tensors_already_written() -> None:
    """Apply writes the biggest tensor's segments while it decodes the others: a payload that passes its checksum
    but fails to decode (a forged delta) is found after the first write, and that write must be undone exactly."""
    base, new = multi_block_pair()
    base["s"], new["s"] = torch.zeros(8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16)
    d = fmt.parse(rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL))
    seg, payload = _forged_segment(8)
    blob = _repack(d, "s", [seg], payload)
    target = {k: v.clone() for k, v in base.items()}
    with pytest.raises(rd.DeltaError, match="'s': a listed change leaves its element unchanged"):
        rd.apply_(target, blob)
    assert_bit_identical(target, base)


def test_forged_later_segment_of_the_same_tensor_rolls_back_its_earlier_segments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Segments are decoded and written independently, biggest first, two at a time: a forged shortest segment is
    queued behind the tensor's other segments, so it fails after at least four of them were written, and those
    writes are undone exactly (restore is spied on, not replaced, to prove there were writes to undo)."""
    from rlboost.delta import _scan, codec

    monkeypatch.setattr(codec, "_SEGMENT_BYTES", 4 * SMALL)  # ~7 segments of the 100 KB tensor
    base, new = multi_block_pair()
    d = fmt.parse(rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL))
    entry = next(e for e in d.tensors if e.name == "bf16")
    spans = entry.spans()
    k = max(range(len(spans)), key=lambda i: (spans[i].start - spans[i].stop, i))  # shortest, last of equals
    assert len(spans) >= 6 and k > 0
    forged, forged_payload = _forged_segment(spans[k].stop)
    payload = bytes(d.payload_of(entry))
    payload = payload[: spans[k].offset] + forged_payload + payload[spans[k].offset + spans[k].seg.length :]
    blob = _repack(d, "bf16", [s.seg for s in spans[:k]] + [forged] + [s.seg for s in spans[k + 1 :]], payload)
    restored: list[int] = []
    real_restore = _scan.restore

    def spy(bits_: np.ndarray, idx: np.ndarray, old: np.ndarray) -> None:
        restored.append(idx.size)
        real_restore(bits_, idx, old)

    monkeypatch.setattr(_scan, "restore", spy)
    target = {k: v.clone() for k, v in base.items()}
    with pytest.raises(rd.DeltaError, match="'bf16': a listed change leaves its element unchanged"):
        rd.apply_(target, blob)
    assert sum(restored) > 0  # earlier segments had been written
    assert_bit_identical(target, base)


def test_segments_off_block_boundaries_or_not_adding_up_are_rejected() -> None:
    base, new = multi_block_pair()
    d = fmt.parse(rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL))
    entry = next(e for e in d.tensors if e.name == "bf16")
    segs = entry.segments
    moved = [segs[0].model_copy(update={"stop": segs[0].stop + 1}), *segs[1:]]
    cases = {
        "not a block boundary": moved,
        "must end at the tensor": segs[:-1],
        "lengths do not add up": [segs[0].model_copy(update={"streams": [n + 1 for n in segs[0].streams]}), *segs[1:]],
        "changed elements in": [segs[0].model_copy(update={"changed": segs[0].stop + 1}), *segs[1:]],
    }
    for msg, bad in cases.items():
        with pytest.raises(rd.DeltaError, match=msg):
            rd.inspect(_repack(d, "bf16", bad, bytes(d.payload_of(entry))))


def _apply_in_child(blob: bytes, base: np.ndarray, new: np.ndarray) -> None:
    from rlboost.delta.codec import BitArray, apply_arrays_

    work = {"w": BitArray("bfloat16", (base.size,), base.copy())}
    apply_arrays_(work, blob)
    sys.exit(0 if np.array_equal(work["w"].bits, new) else 3)


def test_a_forked_child_builds_its_own_thread_pool() -> None:
    """The codec's thread pool lives on after a call; a forked child (a real process) must not wait on the
    parent's threads, which do not exist in the child."""
    import multiprocessing

    base, new = multi_block_pair()
    blob = rd.encode({"w": base["bf16"]}, {"w": new["bf16"]}, base_version=0, version=1, block_bytes=SMALL)
    rd.apply({"w": base["bf16"]}, blob)  # the parent's pool is started
    b16, n16 = (bits(t).numpy().view(np.uint16) for t in (base["bf16"], new["bf16"]))
    child = multiprocessing.get_context("fork").Process(target=_apply_in_child, args=(blob, b16, n16))
    child.start()
    child.join(timeout=60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0


def test_format_1_2_and_3_deltas_are_rejected_with_a_re_encode_hint() -> None:
    for version in (1, 2, 3):
        old = fmt.MAGIC + struct.pack("<H", version) + bytes(80)
        for fn in (rd.inspect, lambda b: rd.apply_({}, b)):
            with pytest.raises(rd.DeltaError, match=f"version {version} .*re-encode"):
                fn(old)


def test_bad_hash_block_size_is_rejected_in_encode_and_in_the_header() -> None:
    base, new = rl_state()
    with pytest.raises(rd.DeltaError, match="hash_block_bytes is 1000; it must be a power of two"):
        rd.encode(base, new, base_version=0, version=1, block_bytes=1000)
    blob = bytearray(rd.encode(base, new, base_version=0, version=1))
    blob[40:44] = struct.pack("<I", 3000)  # hash_block_bytes; then re-sign so only the size is wrong
    table_end = fmt.HEADER_SIZE + struct.unpack_from("<I", blob, 12)[0]
    blob[48:56] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(blob[:48]) + bytes(blob[56:table_end])))
    with pytest.raises(rd.DeltaError, match="hash_block_bytes is 3000"):
        rd.inspect(bytes(blob))


def test_compose_rejects_deltas_hashed_in_different_blocks() -> None:
    base, new = multi_block_pair()
    d_ab = rd.encode(base, new, base_version=0, version=1, block_bytes=SMALL)
    d_ba = rd.encode(new, base, base_version=1, version=2)
    with pytest.raises(rd.DeltaError, match="blocks of 4096 and 1048576 bytes"):
        rd.compose(d_ab, d_ba)
    back = rd.compose(d_ab, rd.encode(new, base, base_version=1, version=2, block_bytes=SMALL))
    assert rd.inspect(back).changed <= 5000  # only the dense tensor's bound remains
    assert_bit_identical(rd.apply(base, back), base)
    third = {k: v.clone() for k, v in new.items()}
    bits(third["bf16"])[::1000] += 2  # a->b->c with multi-segment sparse tensors: composed per segment again
    d_bc = rd.encode(new, third, base_version=1, version=2, block_bytes=SMALL)
    d_ac = rd.compose(d_ab, d_bc)
    assert len(next(e for e in fmt.parse(d_ac).tensors if e.name == "bf16").segments) >= 2
    assert_bit_identical(rd.apply(base, d_ac), third)


def test_position_decoder_rejects_out_of_range_and_wrapping_gaps() -> None:
    from rlboost.delta._scan import read_positions

    def planes(gaps: list[int]) -> np.ndarray:
        return np.ascontiguousarray(np.array(gaps, dtype="<u8").view(np.uint8).reshape(-1, 8).T)

    idx, ok = read_positions(planes([3, 5]), 8, 10)  # the fast path: one check of the largest gap and the end
    assert ok and idx.tolist() == [3, 9]
    assert not read_positions(planes([3, 6]), 8, 10)[1]
    assert not read_positions(planes([2**63 + 5, 1]), 8, 10)[1]
    huge = 2**61  # 3 changes * 2**61 could overflow a running sum: every step is checked instead
    idx, ok = read_positions(planes([0, 1, 2]), 8, huge)
    assert ok and idx.tolist() == [0, 2, 5]
    assert not read_positions(planes([0, 2**63 + 5, 1]), 8, huge)[1]
    assert not read_positions(planes([0, huge - 2, 1]), 8, huge)[1]


# ---------------------------------------------------------------- CLI (real subprocess, real files)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlboost.cli.delta_cmd", *args], capture_output=True, text=True)


@pytest.mark.slow  # four CLI processes, each importing torch: ~30 s on this loaded 2-core machine
def test_cli_encode_apply_inspect_round_trip(tmp_path: Path) -> None:
    base, new = rl_state()
    base = {k: v for k, v in base.items() if v.dim()}  # safetensors files here hold >=1-d tensors
    new = {k: new[k] for k in base}
    save_file(base, tmp_path / "a.safetensors")
    save_file(new, tmp_path / "b.safetensors")
    enc = cli(
        "delta",
        "encode",
        "--base",
        str(tmp_path / "a.safetensors"),
        "--new",
        str(tmp_path / "b.safetensors"),
        "-o",
        str(tmp_path / "d"),
        "--base-version",
        "3",
    )
    assert enc.returncode == 0, enc.stderr
    app = cli(
        "delta",
        "apply",
        "--base",
        str(tmp_path / "a.safetensors"),
        "--delta",
        str(tmp_path / "d"),
        "-o",
        str(tmp_path / "c.safetensors"),
    )
    assert app.returncode == 0, app.stderr
    assert_bit_identical(load_file(tmp_path / "c.safetensors"), new)
    ins = cli("delta", "inspect", str(tmp_path / "d"), "--json")
    info = json.loads(ins.stdout)
    assert (info["base_version"], info["version"]) == (3, 4)
    table = cli("delta", "inspect", str(tmp_path / "d"))
    assert table.returncode == 0 and "bfloat16.w" in table.stdout and "sparse" in table.stdout


def test_cli_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"not a delta at all" * 4)
    missing = cli("delta", "inspect", str(tmp_path / "nope"))
    junk = cli("delta", "inspect", str(tmp_path / "junk"))
    not_st = cli(
        "delta", "apply", "--base", str(tmp_path / "junk"), "--delta", str(tmp_path / "junk"), "-o", str(tmp_path / "o")
    )
    for proc, needle in ((missing, "no such file"), (junk, "not an rlboost delta"), (not_st, "safetensors")):
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def test_cli_bench_json_prints_exactly_the_figures() -> None:
    out = cli("delta", "bench", "--json", "--elements", "200000", "--repeat", "1")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert set(result) == {
        "changed_fraction",
        "bytes_per_changed_element",
        "encode_gb_per_s",
        "apply_gb_per_s",
        "bit_exact",
    }
    assert result["bit_exact"] is True and 0.001 < result["changed_fraction"] < 0.05
    assert result["bytes_per_changed_element"] < 1.5


# ---------------------------------------------------------------- many small tensors (format 4)


def test_tiny_planes_are_stored_raw_and_round_trip() -> None:
    """A tensor with three changes: zstd would add a frame header to 3-byte planes, so every plane is stored raw
    (its stream is exactly the change count long) and still decodes to the exact target."""
    base = {"norm": torch.zeros(768, dtype=torch.bfloat16), "w": torch.randn(50_000, dtype=torch.float32)}
    new = {k: v.clone() for k, v in base.items()}
    bits(new["norm"])[[5, 300, 700]] += torch.tensor([1, -1, 3], dtype=torch.int16)
    bits(new["w"])[::50] += 1
    blob = rd.encode(base, new, base_version=0, version=1)
    entry = next(e for e in fmt.parse(blob).tensors if e.name == "norm")
    assert entry.encoding == "sparse" and [s.streams for s in entry.segments] == [[3, 3, 3, 3]]
    assert_bit_identical(rd.apply(base, blob), new)


def test_many_small_tensors_are_not_split_but_a_dominant_one_is() -> None:
    """A model-like state of many multi-block tensors keeps one segment (one job, one set of streams) per tensor;
    a tensor that is most of the state is split so both threads share it."""
    g = torch.Generator().manual_seed(3)
    base = {f"t{i}": torch.randn(600_000, generator=g).to(torch.bfloat16) for i in range(12)}  # 1.2 MB: 2 blocks
    new = {k: v.clone() for k, v in base.items()}
    for v in new.values():
        bits(v)[::97] += 1
    entries = fmt.parse(rd.encode(base, new, base_version=0, version=1)).tensors
    assert all(e.encoding == "sparse" and len(e.segments) == 1 for e in entries)
    alone = fmt.parse(rd.encode({"t0": base["t0"]}, {"t0": new["t0"]}, base_version=0, version=1)).tensors[0]
    assert len(alone.segments) == 2
    assert_bit_identical(rd.apply(base, rd.encode(base, new, base_version=0, version=1)), new)
    third = {k: v.clone() for k, v in new.items()}
    for v in third.values():
        bits(v)[5::89] += 1
    composed = rd.compose(
        rd.encode(base, new, base_version=0, version=1), rd.encode(new, third, base_version=1, version=2)
    )
    assert all(len(e.segments) == 1 for e in fmt.parse(composed).tensors), "a composed delta is cut as encode cuts"
    assert_bit_identical(rd.apply(base, composed), third)


def _with_table(blob: bytes, table: bytes) -> bytes:
    """`blob` with its table bytes replaced by `table`, the header's length and checksum fixed."""
    d = fmt.parse(blob)
    start = fmt.HEADER_SIZE + d.header.table_len
    head = bytearray(blob[: fmt.HEADER_SIZE])
    head[12:16] = struct.pack("<I", len(table))
    head[48:56] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(head[:48]) + table))
    return bytes(head) + table + blob[start:]


def test_a_table_that_is_not_a_sized_zstd_frame_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Format 4 stores the JSON table as one zstd frame declaring its size: plain JSON, a frame without a size,
    or one declaring more than MAX_TABLE_BYTES are rejected (re-signed, so only the table is wrong)."""
    base, new = rl_state()
    blob = rd.encode(base, new, base_version=0, version=1)
    stored = blob[fmt.HEADER_SIZE : fmt.HEADER_SIZE + fmt.parse(blob).header.table_len]
    text = zstandard.ZstdDecompressor().decompress(stored)
    unsized = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    frame = unsized.compress(text) + unsized.flush()
    monkeypatch.setattr(fmt, "MAX_TABLE_BYTES", len(text))  # the limit is read at parse time
    huge = zstandard.ZstdCompressor().compress(text + b" ")
    cases = {"not a valid zstd frame": text, "does not declare its size": frame, "at most": huge}
    for message, table in cases.items():
        with pytest.raises(rd.DeltaError, match=f"table.*{message}"):
            rd.inspect(_with_table(blob, table))
    assert_bit_identical(rd.apply(base, _with_table(blob, zstandard.ZstdCompressor().compress(text))), new)


def test_an_entry_copied_with_other_segments_plans_its_own_spans() -> None:
    """Spans are kept in the entry's instance dict, which model_copy copies: the copy must not reuse them."""
    entry = fmt.TensorEntry(
        name="w",
        dtype="bfloat16",
        shape=[8],
        encoding="sparse",
        changed=2,
        base_xxh3=0,
        target_xxh3=0,
        offset=0,
        length=6,
        payload_xxh3=0,
        segments=[fmt.SegmentEntry(stop=8, changed=2, gap_planes=1, streams=[2, 2, 2])],
    )
    assert [(s.start, s.stop) for s in entry.spans()] == [(0, 8)]
    halves = [fmt.SegmentEntry(stop=4, changed=1, gap_planes=1, streams=[1, 1, 1])] * 2
    copy = entry.model_copy(update={"segments": [halves[0], halves[1].model_copy(update={"stop": 8})]})
    assert [(s.start, s.stop, s.offset) for s in copy.spans()] == [(0, 4, 0), (4, 8, 3)]
    assert [(s.start, s.stop) for s in entry.spans()] == [(0, 8)]
