"""The compiled segment job of apply (rlboost/delta/_apply_kernel.py): statuses, positions, and parity with the
Python path it replaces (codec.decode_span + _scan.write_segment), which stays as the fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zstandard

import rlboost.delta as rd
from rlboost.delta import _apply_kernel as kernel
from rlboost.delta import format as fmt

pytestmark = pytest.mark.skipif(not kernel.AVAILABLE, reason="this zstandard build does not export libzstd's API")


def gap_planes(gaps: list[int]) -> np.ndarray:
    """Eight little-endian byte planes (rows) of 64-bit gaps."""
    return np.ascontiguousarray(np.array(gaps, dtype="<u8").view(np.uint8).reshape(-1, 8).T)


@pytest.mark.parametrize("checked", [False, True])
def test_positions_reject_out_of_range_and_wrapping_gaps(checked: bool) -> None:
    """Both summations (one check of the largest gap and the end, or a check per step) find the same faults."""

    def positions(gaps: list[int], numel: int) -> tuple[list[int], bool]:
        idx = np.empty(len(gaps), np.int64)
        ok = kernel._positions(gap_planes(gaps), 8, numel, idx, checked)
        return idx.tolist(), bool(ok)

    assert positions([3, 5], 10) == ([3, 9], True)
    assert not positions([3, 6], 10)[1]
    assert not positions([2**63 + 5, 1], 10)[1]
    assert not positions([0, 2**60, 2**60], 2**60)[1]


def segment(planes: list[bytes], *, compress: bool) -> tuple[np.ndarray, np.ndarray]:
    """A segment's payload and stream lengths from its planes (zstd frames, or raw)."""
    streams = [zstandard.ZstdCompressor().compress(p) if compress else p for p in planes]
    return np.frombuffer(b"".join(streams), np.uint8), np.array([len(s) for s in streams], np.int64)


def run(payload: np.ndarray, streams: np.ndarray, changed: int, bits: np.ndarray) -> tuple[int, list[int]]:
    status, idx, _old, _digests = kernel.apply_segment(
        kernel.dctx(), payload, 0, streams, changed, 1, bits, bits, False, 4096, True, False
    )
    return int(status), idx.tolist()


@pytest.mark.parametrize("compress", [False, True])
def test_statuses_name_the_fault_and_nothing_is_written(compress: bool) -> None:
    """One gap plane and two value planes (bf16): a good segment writes; a change past the end, a zero difference
    or a stream that does not decode to its size is reported and leaves the bits as they were."""
    gaps, low, high = bytes([1, 0, 2] * 40), bytes([2] * 120), bytes(120)  # zigzag 2 = +1
    bits = np.zeros(1000, np.uint16)
    assert run(*segment([gaps, low, high], compress=compress), 120, bits)[0] == kernel.OK
    assert int(bits.sum()) == 120
    bits[:] = 0
    far = bytes([250] * 120)  # 120 gaps of 250 run past 1000 elements
    assert run(*segment([far, low, high], compress=compress), 120, bits)[0] == kernel.POSITION_OUT_OF_RANGE
    zero = bytes([2] * 119 + [0])
    assert run(*segment([gaps, zero, high], compress=compress), 120, bits)[0] == kernel.ZERO_DIFFERENCE
    assert not bits.any()


def test_a_frame_declaring_another_size_or_corrupt_is_rejected() -> None:
    bits = np.zeros(1000, np.uint16)
    good = [zstandard.ZstdCompressor().compress(p) for p in (bytes([1] * 100), bytes([2] * 100), bytes(100))]
    short = zstandard.ZstdCompressor().compress(bytes([1] * 99))  # declares 99 bytes, the plane has 100
    broken = good[0][:-3] + b"\x00\x00\x00"  # declares 100 bytes, then does not decode to them
    for first in (short, broken):
        streams = [first, *good[1:]]
        payload = np.frombuffer(b"".join(streams), np.uint8)
        lengths = np.array([len(s) for s in streams], np.int64)
        assert run(payload, lengths, 100, bits)[0] == kernel.CORRUPT_STREAM
    assert not bits.any()


def states() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    base = {
        "bf16": torch.randn(40_000, generator=g).bfloat16(),
        "fp16": torch.randn(300, 7, generator=g).half(),
        "fp32": torch.randn(5000, generator=g),
        "same": torch.ones(64).bfloat16(),
    }
    new = {k: v.clone() for k, v in base.items()}
    for k in ("bf16", "fp16", "fp32"):
        flat = new[k].view(-1)
        flat[::29] = flat[::29] * 1.01
    return base, new


@pytest.mark.parametrize("compiled", [True, False])
def test_compiled_and_python_paths_apply_and_roll_back_alike(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "AVAILABLE", compiled)
    base, new = states()
    blob = rd.encode(base, new, base_version=0, version=1, block_bytes=fmt.MIN_BLOCK_BYTES)  # several segments
    for verify in (True, False):
        work = {k: v.clone() for k, v in base.items()}
        rd.apply_(work, blob, verify_target=verify)
        assert all(torch.equal(work[k].view(-1).view(torch.uint8), new[k].view(-1).view(torch.uint8)) for k in new)
    copied = rd.apply(base, blob)
    assert all(torch.equal(copied[k].view(-1).view(torch.uint8), new[k].view(-1).view(torch.uint8)) for k in new)
    wrong = {k: v.clone() for k, v in base.items()}
    wrong["bf16"][-1] += 1  # a wrong base in the last block: every written element is restored
    before = {k: v.clone() for k, v in wrong.items()}
    with pytest.raises(rd.DeltaError, match="target checksum mismatch"):
        rd.apply_(wrong, blob)
    assert all(torch.equal(wrong[k].view(torch.uint8), before[k].view(torch.uint8)) for k in before)


def test_warm_up_compiles_the_kernels_of_both_element_widths(caplog: pytest.LogCaptureFixture) -> None:
    """What a worker and a trainer run at start-up: afterwards the apply kernel (bytes and bytearray payloads
    alike: one read-only variant) and the scan kernel exist for 2- and 4-byte elements, so no first sync compiles."""
    from rlboost.delta import _scan

    caplog.set_level("INFO", logger="rlboost.delta")
    rd.warm_up_in_background((torch.bfloat16, torch.float32)).join(timeout=300)
    assert "delta codec kernels ready" in caplog.text
    widths = {sig[6].dtype.bitwidth for sig in kernel.apply_segment.signatures}  # arg 6: the segment's bits
    assert widths >= {16, 32}
    assert not any(sig[1].mutable for sig in kernel.apply_segment.signatures), "payloads are passed read-only"
    assert {sig[0].dtype.bitwidth for sig in _scan._scan.signatures} >= {16, 32}
    built = len(kernel.apply_segment.signatures)
    base = {"w": torch.zeros(8192, dtype=torch.float16)}  # fp16: the 2-byte variant bf16 already built
    new = {"w": base["w"].clone()}
    new["w"][::7] = 1  # sparse: through the segment kernel
    rd.apply_(base, bytearray(rd.encode(base, new, base_version=0, version=1)))
    assert len(kernel.apply_segment.signatures) == built
