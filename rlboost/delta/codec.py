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

Speed (see _scan.py): encode reads each base/new pair once, scanning and hashing it chunk by
chunk in cache; the byte planes of all tensors are then compressed on a pool of threads. Apply
decodes every payload (checksums, positions in range, no empty change) before the first write,
then writes each sparse tensor chunk by chunk and hashes it as it goes: one pass over memory.
The target checksum also proves the base: the delta maps a base to its target bijectively
(fixed positions, fixed modular differences), so the result matches the target's checksum only
if the base was the delta's base. On a mismatch every written element is restored exactly
before DeltaError is raised, so a bad delta or a wrong base never leaves half-applied weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np
import zstandard

from rlboost.delta._scan import Scan, byte_planes, read_planes, restore, scan_pair, write, write_and_hash
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
_ZSTD_LEVEL = 1  # level 1..19 give the same size on these planes (measured); 1 is fastest
_THREADS = 2  # this machine's cores: the kernels and zstd release the GIL
_PARALLEL_PLANES = 1 << 16  # changes in a tensor from which its planes are decompressed in parallel
_T = TypeVar("_T")
_R = TypeVar("_R")


class BitArray(NamedTuple):
    """A tensor as raw bits: dtype name, shape, and a flat C-contiguous unsigned view of its bytes."""

    dtype: str
    shape: tuple[int, ...]
    bits: np.ndarray


class Staged(NamedTuple):
    """A validated, decoded tensor change: sparse (positions, modular differences) or dense (new bits)."""

    entry: TensorEntry
    idx: np.ndarray | None
    values: np.ndarray | None  # sparse: the differences new - old; dense: the new bits


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


def _pmap(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


# ---------------------------------------------------------------- sparse streams


def _compress(plane: np.ndarray) -> bytes:
    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(plane)


def encode_sparse(idx: np.ndarray, diff: np.ndarray) -> tuple[list[bytes], int]:
    """Compressed streams (gap planes, then value planes) for sorted positions and modular differences."""
    planes, gap_planes = byte_planes(idx, diff)
    return [_compress(p) for p in planes], gap_planes


def _decompress_into(frame: bytes | memoryview, out: np.ndarray, what: str) -> None:
    size = out.size
    try:
        declared = zstandard.frame_content_size(frame)
        if declared != size:
            raise DeltaError(f"{what}: stream declares {declared} bytes, expected {size}")
        data = zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise DeltaError(f"{what}: corrupt compressed stream ({e})") from None
    if len(data) != size:
        raise DeltaError(f"{what}: stream decompressed to {len(data)} bytes, expected {size}")
    out[:] = np.frombuffer(data, dtype=np.uint8)


def decode_sparse(entry: TensorEntry, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Positions (int64, strictly increasing, in range) and modular differences of a sparse entry."""
    where = f"tensor {entry.name!r}"
    planes = np.empty((len(entry.streams), entry.changed), dtype=np.uint8)
    ends = np.cumsum(entry.streams).tolist()
    frames = [(i, payload[end - length : end]) for i, (length, end) in enumerate(zip(entry.streams, ends, strict=True))]
    # The planes of a large tensor are decompressed on both threads (zstd releases the GIL).
    run = _pmap if entry.changed >= _PARALLEL_PLANES else lambda fn, items: [fn(x) for x in items]
    run(lambda f: _decompress_into(f[1], planes[f[0]], f"{where} stream {f[0]}"), frames)
    idx, diff, status = read_planes(planes, entry.gap_planes, entry.numel, _UINT[entry.itemsize])
    if status == 1:
        raise DeltaError(f"{where}: positions run past the end of the tensor ({entry.numel} elements)")
    if status == 2:
        raise DeltaError(f"{where}: a listed change leaves its element unchanged")
    return idx, diff


# ---------------------------------------------------------------- encode


def _entry(name: str, new: BitArray, scan: Scan, **fields: object) -> TensorEntry:
    return TensorEntry(
        name=name,
        dtype=new.dtype,
        shape=list(new.shape),
        base_xxh3=scan.base_xxh3,
        target_xxh3=scan.target_xxh3,
        changed=scan.changed,
        offset=0,
        **fields,
    )


def _scan_tensor(old: BitArray, new: BitArray) -> tuple[Scan, np.ndarray | None, int]:
    # Past a quarter of the elements changed, sparse rarely wins and its index arrays grow large.
    scan = scan_pair(old.bits, new.bits, limit=new.bits.size // 4)
    if scan.idx is None or scan.changed == 0:
        return scan, None, 0
    planes, gap_planes = byte_planes(scan.idx, scan.diff)
    return scan, planes, gap_planes


def _finish_tensor(name: str, new: BitArray, scan: Scan, streams: list[bytes] | None, gap_planes: int):
    if scan.changed == 0:
        return _entry(name, new, scan, encoding="unchanged", length=0, payload_xxh3=checksum(b"")), b""
    if streams is not None:
        payload = b"".join(streams)
        if len(payload) < new.bits.nbytes:
            fields = dict(streams=[len(s) for s in streams], gap_planes=gap_planes)
            entry = _entry(name, new, scan, encoding="sparse", length=len(payload), payload_xxh3=checksum(payload))
            return entry.model_copy(update=fields), payload
    payload = new.bits.tobytes()
    # The dense payload is the target itself: its checksum is already known.
    return _entry(name, new, scan, encoding="dense", length=len(payload), payload_xxh3=scan.target_xxh3), payload


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
    # Biggest first, so the two threads finish together.
    order = sorted(names, key=lambda n: -new[n].bits.nbytes)
    scanned = dict(zip(order, _pmap(lambda n: _scan_tensor(base[n], new[n]), order), strict=True))
    # Every plane of every tensor is one compression job: a single large tensor uses both threads too.
    jobs = [(n, p) for n in order if scanned[n][1] is not None for p in scanned[n][1]]
    compressed = _pmap(lambda job: _compress(job[1]), jobs)
    streams: dict[str, list[bytes]] = {}
    for (name, _), frame in zip(jobs, compressed, strict=True):
        streams.setdefault(name, []).append(frame)
    entries, parts, offset = [], [], 0
    for name in names:
        scan, _, gap_planes = scanned[name]
        entry, payload = _finish_tensor(name, new[name], scan, streams.get(name), gap_planes)
        entries.append(entry.model_copy(update={"offset": offset}))
        parts.append(payload)
        offset += len(payload)
    return pack(base_version, version, entries, parts)


# ---------------------------------------------------------------- apply


def decode_entry(delta: Delta, entry: TensorEntry) -> Staged:
    """Check a tensor's payload checksum and decode it: positions and differences, or the dense new bits."""
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


def _check_base(entry: TensorEntry, arr: BitArray) -> None:
    where = f"tensor {entry.name!r}"
    if arr.dtype != entry.dtype:
        raise DeltaError(f"{where}: base has dtype {arr.dtype}, delta expects {entry.dtype} (wrong base)")
    if tuple(arr.shape) != tuple(entry.shape):
        raise DeltaError(f"{where}: base has shape {tuple(arr.shape)}, delta expects {tuple(entry.shape)} (wrong base)")


def stage(delta: bytes | Delta, base: Mapping[str, BitArray]) -> tuple[Delta, list[Staged]]:
    """Validate a whole delta against `base`'s names, dtypes and shapes and decode every payload, touching
    nothing (the base's bits are checked by the target checksums as they are written). Raises DeltaError."""
    d = delta if isinstance(delta, Delta) else parse(delta)
    _check_names({e.name: e for e in d.tensors}, base, "delta vs base")
    for e in d.tensors:
        _check_base(e, base[e.name])
    return d, _pmap(lambda e: decode_entry(d, e), d.tensors)


class _Written(NamedTuple):
    staged: Staged
    old: np.ndarray | None  # the overwritten bits of a sparse tensor, to roll back
    ok: bool


def _write_one(s: Staged, dst: np.ndarray, src: np.ndarray | None, verify: bool) -> _Written:
    """Write one non-dense tensor into dst (from src when given, else in place); hash it when verifying."""
    idx = s.idx if s.idx is not None else np.empty(0, dtype=np.int64)
    diff = s.values if s.values is not None else np.empty(0, dtype=dst.dtype)
    if verify or src is not None:
        old, digest = write_and_hash(dst, idx, diff, src)
        return _Written(s, old, not verify or digest == s.entry.target_xxh3)
    return _Written(s, write(dst, idx, diff), True)


def _write_all(
    d: Delta, staged: list[Staged], dst: Mapping[str, BitArray], src: Mapping[str, BitArray] | None, verify: bool
) -> None:
    """Write every tensor into dst, sparse and unchanged ones first (checked against the targets as they are
    written; on a mismatch all are restored and DeltaError raised), then the dense ones (verified in decoding)."""
    todo = [s for s in staged if s.entry.encoding != "dense"]
    todo.sort(key=lambda s: -s.entry.nbytes)
    results = _pmap(
        lambda s: _write_one(s, dst[s.entry.name].bits, None if src is None else src[s.entry.name].bits, verify),
        todo,
    )
    bad = [w.staged.entry.name for w in results if not w.ok]
    if bad:
        if src is None:  # in place: undo every write exactly
            for w in results:
                if w.staged.idx is not None:
                    restore(dst[w.staged.entry.name].bits, w.staged.idx, w.old)
        raise DeltaError(
            f"target checksum mismatch for {_names(bad)}: these weights are not version {d.header.base_version} "
            "(wrong base) or the delta is forged; nothing applied"
        )
    for s in staged:
        if s.entry.encoding == "dense":
            dst[s.entry.name].bits[:] = s.values


def apply_arrays_(base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True) -> Delta:
    """Apply a delta in place. Structure, payload checksums and decoded positions are validated before the first
    write; with `verify_target` every tensor is hashed as it is written and, on a mismatch (a wrong base or a
    forged delta), every written element is restored exactly before DeltaError is raised. Without it nothing
    full-size is read: the caller vouches for the base (e.g. by a whole-state checksum)."""
    d, staged = stage(delta, base)
    _write_all(d, staged, base, None, verify_target)
    return d


def apply_arrays(
    base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True
) -> dict[str, BitArray]:
    """Apply a delta to copies of the base arrays (copied, changed and hashed in one pass); the base is untouched."""
    d, staged = stage(delta, base)
    out = {name: BitArray(a.dtype, a.shape, np.empty_like(a.bits)) for name, a in base.items()}
    _write_all(d, staged, out, base, verify_target)
    return out
