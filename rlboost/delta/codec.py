"""The delta codec on raw bit patterns: numpy arrays of unsigned integers, no torch.

A tensor is a `BitArray`: its dtype name, shape and a flat unsigned-integer view of its bytes
(uint8/16/32/64 by element size). Changes are found by comparing bit patterns, never values,
so NaN payloads, ±0, inf and subnormals are carried exactly.

Sparse encoding (chosen by measurement, see docs/benchmarks.md): positions as gaps
(idx[i] - idx[i-1] - 1), split into little-endian byte planes, each plane zstd-compressed; values
as the modular difference new_bits - old_bits (wrapping at the element width), zigzagged so
small steps of either sign are small numbers, split into byte planes, each zstd-compressed.
An RL step moves most changed bf16 elements by one unit in the last place, so the value planes
compress to about a third of a byte per changed element and the gap planes near the entropy
bound of the positions. Modular differences compose by addition, so deltas compose without the
weights (see compact.py).

`stage` validates a whole delta against the base (names, dtypes, shapes, payload and base
checksums, decoded positions) before `commit` writes anything: a bad delta never half-applies.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import zstandard

from rlboost.delta._scan import changed_positions
from rlboost.delta.format import (
    DTYPE_ITEMSIZE,
    Delta,
    DeltaError,
    TensorEntry,
    checksum,
    pack,
    parse,
)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
_ZSTD_LEVEL = 1  # level 1..19 give the same size on these planes (measured); 1 is fastest
_THREADS = 2


class BitArray(NamedTuple):
    """A tensor as raw bits: dtype name, shape, and a flat C-contiguous unsigned view of its bytes."""

    dtype: str
    shape: tuple[int, ...]
    bits: np.ndarray


class Staged(NamedTuple):
    """A validated, decoded tensor change, ready to write: sparse (idx, new values) or dense (new bits)."""

    entry: TensorEntry
    idx: np.ndarray | None
    values: np.ndarray | None
    old: np.ndarray | None = None  # sparse: the overwritten bit patterns, to roll back a failed target check


def uint_dtype(dtype: str) -> type[np.unsignedinteger]:
    """The unsigned numpy type with the element width of `dtype`."""
    try:
        return _UINT[DTYPE_ITEMSIZE[dtype]]
    except KeyError:
        raise DeltaError(f"unsupported dtype {dtype!r}; supported: {', '.join(sorted(DTYPE_ITEMSIZE))}") from None


def bit_array(dtype: str, shape: tuple[int, ...], data: np.ndarray) -> BitArray:
    """Wrap a contiguous numpy array of any type as a BitArray of `dtype` (a view, no copy)."""
    flat = np.ascontiguousarray(data).reshape(-1).view(np.uint8).view(uint_dtype(dtype))
    return BitArray(dtype, tuple(shape), flat)


# ---------------------------------------------------------------- scanning


# ---------------------------------------------------------------- sparse streams


def _planes(x: np.ndarray, count: int) -> list[bytes]:
    cols = x.view(np.uint8).reshape(-1, x.itemsize)
    return [np.ascontiguousarray(cols[:, j]).tobytes() for j in range(count)]


def _zigzag(diff: np.ndarray) -> np.ndarray:
    # Shift the unsigned view left (no signed overflow) and XOR with the sign spread over all bits.
    sign = (diff.view(_SINT[diff.itemsize]) >> (diff.itemsize * 8 - 1)).view(diff.dtype)
    return (diff << diff.dtype.type(1)) ^ sign


def _unzigzag(z: np.ndarray) -> np.ndarray:
    s = z.view(_SINT[z.itemsize])
    return ((z >> 1).view(s.dtype) ^ -(s & 1)).view(z.dtype)


def encode_sparse(idx: np.ndarray, diff: np.ndarray) -> tuple[list[bytes], int]:
    """Compressed streams (gap planes, then value planes) for sorted positions and modular differences."""
    gaps = np.diff(idx, prepend=-1).astype(np.uint64) - np.uint64(1)
    top = int(gaps.max()) if gaps.size else 0
    gap_planes = max(1, (top.bit_length() + 7) // 8)
    cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
    raw = _planes(gaps, gap_planes) + _planes(_zigzag(diff), diff.itemsize)
    return [cctx.compress(r) for r in raw], gap_planes


def _decompress(frame: bytes | memoryview, size: int, what: str) -> np.ndarray:
    try:
        declared = zstandard.frame_content_size(frame)
        if declared != size:
            raise DeltaError(f"{what}: stream declares {declared} bytes, expected {size}")
        out = zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise DeltaError(f"{what}: corrupt compressed stream ({e})") from None
    if len(out) != size:
        raise DeltaError(f"{what}: stream decompressed to {len(out)} bytes, expected {size}")
    return np.frombuffer(out, dtype=np.uint8)


def decode_sparse(entry: TensorEntry, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Positions (int64, strictly increasing, in range) and modular differences of a sparse entry."""
    where = f"tensor {entry.name!r}"
    k, isz = entry.changed, entry.itemsize
    frames, pos = [], 0
    for length in entry.streams:
        frames.append(payload[pos : pos + length])
        pos += length
    planes = [_decompress(f, k, f"{where} stream {i}") for i, f in enumerate(frames)]
    gaps = np.zeros(k, dtype=np.uint64)
    for j, p in enumerate(planes[: entry.gap_planes]):
        gaps |= p.astype(np.uint64) << np.uint64(8 * j)
    # Bound the sum before the cumulative sum so it cannot wrap: positions must fit in the tensor.
    if float(gaps.sum(dtype=np.float64)) + k > entry.numel + 1.0:
        raise DeltaError(f"{where}: positions run past the end of the tensor ({entry.numel} elements)")
    idx = np.cumsum(gaps + np.uint64(1), dtype=np.uint64).view(np.int64) - 1
    if idx[-1] >= entry.numel:
        raise DeltaError(f"{where}: position {int(idx[-1])} is outside the tensor ({entry.numel} elements)")
    vals = np.stack(planes[entry.gap_planes :], axis=1).reshape(-1).view(_UINT[isz])
    diff = _unzigzag(vals)
    if not diff.all():
        raise DeltaError(f"{where}: a listed change leaves its element unchanged")
    return idx, diff


# ---------------------------------------------------------------- encode


def _encode_tensor(name: str, old: BitArray, new: BitArray) -> tuple[TensorEntry, bytes]:
    base_sum, target_sum = checksum(old.bits), checksum(new.bits)
    common = dict(name=name, dtype=new.dtype, shape=list(new.shape), base_xxh3=base_sum, target_xxh3=target_sum)
    if base_sum == target_sum:
        entry = TensorEntry(encoding="unchanged", changed=0, offset=0, length=0, payload_xxh3=checksum(b""), **common)
        return entry, b""
    # Past a quarter of the elements changed, sparse rarely wins and its index arrays grow large.
    idx = changed_positions(old.bits, new.bits, limit=new.bits.size // 4)
    nbytes = new.bits.nbytes
    if idx is not None:
        diff = new.bits[idx] - old.bits[idx]  # wraps at the element width: exact on bit patterns
        streams, gap_planes = encode_sparse(idx, diff)
        payload = b"".join(streams)
        if len(payload) < nbytes:
            entry = TensorEntry(
                encoding="sparse",
                changed=int(idx.size),
                offset=0,
                length=len(payload),
                payload_xxh3=checksum(payload),
                streams=[len(s) for s in streams],
                gap_planes=gap_planes,
                **common,
            )
            return entry, payload
    payload = new.bits.tobytes()
    changed = int(idx.size) if idx is not None else int(np.count_nonzero(old.bits != new.bits))
    entry = TensorEntry(
        encoding="dense", changed=changed, offset=0, length=nbytes, payload_xxh3=checksum(payload), **common
    )
    return entry, payload


def _check_pair(name: str, old: BitArray, new: BitArray) -> None:
    if old.dtype != new.dtype:
        raise DeltaError(f"tensor {name!r}: base dtype {old.dtype} differs from new dtype {new.dtype}")
    if tuple(old.shape) != tuple(new.shape):
        raise DeltaError(f"tensor {name!r}: base shape {tuple(old.shape)} differs from new shape {tuple(new.shape)}")
    uint_dtype(new.dtype)


def _check_names(expected: Mapping[str, object], got: Mapping[str, object], what: str) -> None:
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_names(missing)}")
        if extra:
            parts.append(f"extra {_names(extra)}")
        raise DeltaError(f"{what}: tensor names differ ({'; '.join(parts)})")


def _names(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def encode_arrays(
    base: Mapping[str, BitArray], new: Mapping[str, BitArray], *, base_version: int, version: int
) -> bytes:
    """Encode the change from `base` to `new` (same names, dtypes and shapes) as delta bytes."""
    _check_names(new, base, "base vs new")
    names = list(new)
    for name in names:
        _check_pair(name, base[name], new[name])
    with ThreadPoolExecutor(_THREADS) as pool:
        encoded = list(pool.map(lambda n: _encode_tensor(n, base[n], new[n]), names))
    entries, parts, offset = [], [], 0
    for entry, payload in encoded:
        entries.append(entry.model_copy(update={"offset": offset}))
        parts.append(payload)
        offset += len(payload)
    return pack(base_version, version, entries, parts)


# ---------------------------------------------------------------- apply


def decode_entry(delta: Delta, entry: TensorEntry) -> Staged:
    """Check a tensor's payload checksum and decode it (positions + new values need the base; see stage)."""
    payload = delta.payload_of(entry)
    if checksum(payload) != entry.payload_xxh3:
        raise DeltaError(f"tensor {entry.name!r}: payload checksum mismatch (corrupted delta)")
    if entry.encoding == "unchanged":
        return Staged(entry, None, None)
    if entry.encoding == "dense":
        if entry.payload_xxh3 != entry.target_xxh3:  # a dense payload is the target itself
            raise DeltaError(f"tensor {entry.name!r}: dense payload does not match the target checksum")
        return Staged(entry, None, np.frombuffer(payload, dtype=_UINT[entry.itemsize]))
    idx, diff = decode_sparse(entry, payload)
    return Staged(entry, idx, diff)


def _stage_one(delta: Delta, entry: TensorEntry, arr: BitArray) -> Staged:
    where = f"tensor {entry.name!r}"
    if arr.dtype != entry.dtype:
        raise DeltaError(f"{where}: base has dtype {arr.dtype}, delta expects {entry.dtype} (wrong base)")
    if tuple(arr.shape) != tuple(entry.shape):
        raise DeltaError(f"{where}: base has shape {tuple(arr.shape)}, delta expects {tuple(entry.shape)} (wrong base)")
    staged = decode_entry(delta, entry)
    if checksum(arr.bits) != entry.base_xxh3:
        raise DeltaError(
            f"{where}: base checksum mismatch: these weights are not version {delta.header.base_version} (wrong base)"
        )
    if staged.idx is not None:
        # The new bit patterns are computed now, before anything is written; the old ones kept for rollback.
        old = arr.bits[staged.idx]
        staged = Staged(entry, staged.idx, old + staged.values, old)
    return staged


def stage(delta: bytes | Delta, base: Mapping[str, BitArray]) -> tuple[Delta, list[Staged]]:
    """Validate a whole delta against `base` and decode it, touching nothing. Raises DeltaError."""
    d = delta if isinstance(delta, Delta) else parse(delta)
    _check_names({e.name: e for e in d.tensors}, base, "delta vs base")
    with ThreadPoolExecutor(_THREADS) as pool:
        staged = list(pool.map(lambda e: _stage_one(d, e, base[e.name]), d.tensors))
    return d, staged


def commit(staged: list[Staged], base: Mapping[str, BitArray]) -> None:
    """Write staged changes into the base arrays (in place)."""
    for s in staged:
        bits = base[s.entry.name].bits
        if s.idx is not None:
            bits[s.idx] = s.values
        elif s.values is not None:
            bits[:] = s.values


def apply_arrays_(base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True) -> Delta:
    """Apply a delta in place. Everything checkable is validated before the first write (structure, payload
    and base checksums, dense targets); with `verify_target` the sparse targets are re-hashed after the write
    and, on a mismatch (only a forged delta with valid payload checksums gets there), every written tensor
    is rolled back exactly before DeltaError is raised."""
    d, staged = stage(delta, base)
    sparse = [s for s in staged if s.idx is not None]
    commit(sparse, base)  # dense entries were fully verified in stage(); they are written last
    if verify_target:
        bad = [s.entry.name for s in sparse if checksum(base[s.entry.name].bits) != s.entry.target_xxh3]
        if bad:
            for s in sparse:
                base[s.entry.name].bits[s.idx] = s.old
            raise DeltaError(f"target checksum mismatch after applying {_names(bad)}; rolled back, nothing applied")
    commit([s for s in staged if s.idx is None], base)
    return d


def apply_arrays(base: Mapping[str, BitArray], delta: bytes | Delta) -> dict[str, BitArray]:
    """Apply a delta to copies of the base arrays; the base is left untouched."""
    d, staged = stage(delta, base)
    out = {name: BitArray(a.dtype, a.shape, a.bits.copy()) for name, a in base.items()}
    commit(staged, out)
    return out
