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

Speed (see _scan.py): every tensor is cut into runs of whole hash blocks (segments; checksums are
block-wise, see format.tensor_checksum), and each stage hands the segments or streams of all
tensors to a persistent pool of two threads (this machine's cores; the kernels, xxhash and zstd
release the GIL), so one large tensor uses both cores. Encode reads each base/new pair once,
scanning and hashing it chunk by chunk in cache, then builds and compresses the byte planes.
Apply checks every payload checksum and decodes every payload (positions in range, no empty
change) before the first write, the gap planes and the value planes of a tensor on different
threads, then writes each tensor segment by segment and hashes it as it goes: one pass over memory.
The target checksum also proves the base: the delta maps a base to its target bijectively
(fixed positions, fixed modular differences), so the result matches the target's checksum only
if the base was the delta's base. On a mismatch every written element is restored exactly
before DeltaError is raised, so a bad delta or a wrong base never leaves half-applied weights.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np
import zstandard

from rlboost.delta import _scan
from rlboost.delta._scan import Segment, SegScan, fill_planes, gap_planes_for, max_gap, segments
from rlboost.delta.format import (
    DEFAULT_BLOCK_BYTES,
    DTYPE_ITEMSIZE,
    Delta,
    DeltaError,
    TensorEntry,
    block_digests,
    check_block_bytes,
    combine_digests,
    pack,
    parse,
    tensor_checksum,
)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_ZSTD_LEVEL = 1  # level 1..19 give the same size on these planes (measured); 1 is fastest
_THREADS = 2  # this machine's cores: the kernels, xxhash and zstd release the GIL
_T = TypeVar("_T")
_R = TypeVar("_R")
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_LOCAL = threading.local()
_AHEAD = 2  # tensors decoded ahead of the one being written (1 left threads idle between tensors: measured)


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


def _pool() -> ThreadPoolExecutor:
    # One pool per process, kept: starting threads on every call costs more than a small tensor's work.
    # Keyed by pid, so a forked child builds its own instead of waiting on its parent's threads.
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(_THREADS, thread_name_prefix="rlboost-delta"))
    return _POOL[1]


def _pmap(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """fn over items on the pool (in order; the first exception is raised). Jobs must not call _pmap."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    return list(_pool().map(fn, items))


# ---------------------------------------------------------------- sparse streams


def _zstd() -> threading.local:
    """This thread's zstd (de)compressor: a fresh context per stream allocates and first-touches its tables
    every time (measured ~0.2 ms per stream, most of the time of a model's many small tensors). Contexts are
    not thread-safe, hence one per thread."""
    if not hasattr(_LOCAL, "cctx"):
        _LOCAL.cctx = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
        _LOCAL.dctx = zstandard.ZstdDecompressor()
    return _LOCAL


def _compress(plane: np.ndarray) -> bytes:
    return _zstd().cctx.compress(plane)


def encode_sparse(idx: np.ndarray, diff: np.ndarray) -> tuple[list[bytes], int]:
    """Compressed streams (gap planes, then value planes) for sorted positions and modular differences."""
    planes, gap_planes = _scan.byte_planes(idx, diff)
    return [_compress(p) for p in planes], gap_planes


def _decompress_into(frame: bytes | memoryview, out: np.ndarray, what: str) -> None:
    size = out.size
    try:
        declared = zstandard.frame_content_size(frame)
        if declared != size:
            raise DeltaError(f"{what}: stream declares {declared} bytes, expected {size}")
        data = _zstd().dctx.decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise DeltaError(f"{what}: corrupt compressed stream ({e})") from None
    if len(data) != size:
        raise DeltaError(f"{what}: stream decompressed to {len(data)} bytes, expected {size}")
    out[:] = np.frombuffer(data, dtype=np.uint8)


class _Sparse(NamedTuple):
    """A sparse entry being decoded: its planes, filled by two jobs (gap planes, value planes)."""

    entry: TensorEntry
    payload: memoryview
    planes: np.ndarray


def _sparse_start(entry: TensorEntry, payload: memoryview) -> _Sparse:
    return _Sparse(entry, payload, np.empty((len(entry.streams), entry.changed), dtype=np.uint8))


def _decode_half(job: tuple[_Sparse, bool]) -> np.ndarray:
    """Decompress and read the gap planes (positions) or the value planes (differences) of a sparse entry."""
    sp, gaps = job
    e = sp.entry
    where = f"tensor {e.name!r}"
    ends = np.cumsum(e.streams).tolist()
    planes = range(e.gap_planes) if gaps else range(e.gap_planes, len(e.streams))
    for i in planes:
        _decompress_into(sp.payload[ends[i] - e.streams[i] : ends[i]], sp.planes[i], f"{where} stream {i}")
    if gaps:
        idx, ok = _scan.read_positions(sp.planes, e.gap_planes, e.numel)
        if not ok:
            raise DeltaError(f"{where}: positions run past the end of the tensor ({e.numel} elements)")
        return idx
    diff, ok = _scan.read_values(sp.planes, e.gap_planes, _UINT[e.itemsize])
    if not ok:
        raise DeltaError(f"{where}: a listed change leaves its element unchanged")
    return diff


def decode_sparse(entry: TensorEntry, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Positions (int64, strictly increasing, in range) and modular differences of a sparse entry."""
    sp = _sparse_start(entry, payload)
    idx, diff = _pmap(_decode_half, [(sp, True), (sp, False)])
    return idx, diff


# ---------------------------------------------------------------- encode


class _Pair(NamedTuple):
    name: str
    old: BitArray
    new: BitArray
    segs: list[Segment]


def _entry(name: str, new: BitArray, scan: _scan.Scan, **fields: object) -> TensorEntry:
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


def _joined(pair: _Pair, parts: list[SegScan], block_bytes: int) -> tuple[_scan.Scan, list[SegScan] | None]:
    """The segments' scans as one tensor's counts and checksums, and the segments' changes when it goes sparse
    (None when unchanged or when a segment passed its limit: then it goes dense)."""
    changed = sum(p.changed for p in parts)
    base = combine_digests([d for p in parts for d in p.base_blocks], pair.new.bits.nbytes, block_bytes)
    target = combine_digests([d for p in parts for d in p.target_blocks], pair.new.bits.nbytes, block_bytes)
    scan = _scan.Scan(None, None, changed, base, target)
    return scan, None if changed == 0 or any(p.idx is None for p in parts) else parts


def _finish_tensor(
    name: str, new: BitArray, scan: _scan.Scan, streams: list[bytes] | None, gap_planes: int, b: int
) -> tuple[TensorEntry, bytes]:
    """The table entry and payload of one tensor: unchanged, sparse, or dense when sparse is not smaller."""
    if scan.changed == 0:
        return _entry(name, new, scan, encoding="unchanged", length=0, payload_xxh3=tensor_checksum(b"", b)), b""
    if streams is not None:
        payload = b"".join(streams)
        if len(payload) < new.bits.nbytes:
            fields = dict(streams=[len(s) for s in streams], gap_planes=gap_planes)
            checksum = tensor_checksum(payload, b)
            entry = _entry(name, new, scan, encoding="sparse", length=len(payload), payload_xxh3=checksum)
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


def _scan_job(pair: _Pair, seg: Segment, block_bytes: int) -> SegScan:
    # Past a quarter of the elements changed, sparse rarely wins and its index arrays grow large.
    limit = (seg.stop - seg.start) // 4
    return _scan.scan_segment(pair.old.bits, pair.new.bits, seg, limit, block_bytes)


def _planes_of(pair: _Pair, parts: list[SegScan]) -> tuple[np.ndarray, int, list[tuple[SegScan, int, int]]]:
    """The (unfilled) planes array of a sparse tensor, its gap planes, and per segment (scan, prev, column)."""
    fills, prev, col = [], -1, 0
    for p in parts:
        if p.changed:
            fills.append((p, prev, col))
            prev, col = int(p.idx[-1]), col + p.changed
    gap_planes = gap_planes_for(max(max_gap(p.idx, prev) for p, prev, _ in fills))  # ~0.3 ms per 1M changes
    return np.empty((gap_planes + pair.new.bits.itemsize, col), dtype=np.uint8), gap_planes, fills


def encode_arrays(
    base: Mapping[str, BitArray],
    new: Mapping[str, BitArray],
    *,
    base_version: int,
    version: int,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> bytes:
    """Encode the change from `base` to `new` (same names, dtypes and shapes) as delta bytes."""
    check_block_bytes(block_bytes)
    _check_names(new, base, "base vs new")
    names = list(new)
    for name in names:
        _check_pair(name, base[name], new[name])
    pairs = {
        n: _Pair(n, base[n], new[n], segments(new[n].bits.size, new[n].bits.itemsize, _THREADS, block_bytes))
        for n in names
    }
    # Every segment of every tensor is one scan job, biggest first so the two threads finish together.
    jobs = sorted(((p, s) for p in pairs.values() for s in p.segs), key=lambda j: j[1].start - j[1].stop)
    scans = _pmap(lambda j: _scan_job(j[0], j[1], block_bytes), jobs)
    by_seg = {(j[0].name, j[1].start): s for j, s in zip(jobs, scans, strict=True)}
    joined = {n: _joined(p, [by_seg[(n, s.start)] for s in p.segs], block_bytes) for n, p in pairs.items()}
    sparse = [n for n in names if joined[n][1] is not None]
    layouts = {n: _planes_of(pairs[n], joined[n][1]) for n in sparse}
    fills = [(layouts[n][0], layouts[n][1], f) for n in sparse for f in layouts[n][2]]
    _pmap(lambda f: fill_planes(f[2][0].idx, f[2][0].diff, f[2][1], f[1], f[0], f[2][2]), fills)
    # Every plane of every tensor is one compression job: a single large tensor uses both threads too.
    zjobs = [(n, plane) for n in sparse for plane in layouts[n][0]]
    compressed = _pmap(lambda job: _compress(job[1]), zjobs)
    streams: dict[str, list[bytes]] = {}
    for (name, _), frame in zip(zjobs, compressed, strict=True):
        streams.setdefault(name, []).append(frame)
    entries, parts, offset = [], [], 0
    for name in names:
        gap_planes = layouts[name][1] if name in layouts else 0
        scan = joined[name][0]
        entry, payload = _finish_tensor(name, new[name], scan, streams.get(name), gap_planes, block_bytes)
        entries.append(entry.model_copy(update={"offset": offset}))
        parts.append(payload)
        offset += len(payload)
    return pack(base_version, version, entries, parts, block_bytes)


# ---------------------------------------------------------------- apply


def decode_entry(delta: Delta, entry: TensorEntry) -> Staged:
    """Check a tensor's payload checksum and decode it: positions and differences, or the dense new bits."""
    payload = delta.payload_of(entry)
    if tensor_checksum(payload, delta.block_bytes) != entry.payload_xxh3:
        raise DeltaError(f"tensor {entry.name!r}: payload checksum mismatch (corrupted delta)")
    return _decoded(entry, payload, None)


def _decoded(entry: TensorEntry, payload: memoryview, sparse: tuple[np.ndarray, np.ndarray] | None) -> Staged:
    """A Staged from a checked payload (sparse: its decoded positions and differences, decoded here if None)."""
    if entry.encoding == "unchanged":
        return Staged(entry, None, None)
    if entry.encoding == "dense":
        if entry.payload_xxh3 != entry.target_xxh3:  # a dense payload is the target itself
            raise DeltaError(f"tensor {entry.name!r}: dense payload does not match the target checksum")
        return Staged(entry, None, np.frombuffer(payload, dtype=_UINT[entry.itemsize]))
    idx, diff = sparse if sparse is not None else decode_sparse(entry, payload)
    return Staged(entry, idx, diff)


def _check_base(entry: TensorEntry, arr: BitArray) -> None:
    where = f"tensor {entry.name!r}"
    if arr.dtype != entry.dtype:
        raise DeltaError(f"{where}: base has dtype {arr.dtype}, delta expects {entry.dtype} (wrong base)")
    if tuple(arr.shape) != tuple(entry.shape):
        raise DeltaError(f"{where}: base has shape {tuple(arr.shape)}, delta expects {tuple(entry.shape)} (wrong base)")


def _check_payloads(d: Delta) -> None:
    """Every payload checksum, the blocks of large payloads split over the threads."""
    b = d.block_bytes
    jobs = [(e, s) for e in d.tensors for s in segments(e.length, 1, _THREADS, b)]
    digests = _pmap(lambda j: block_digests(d.payload_of(j[0]), b, j[1].start // b, -(-j[1].stop // b)), jobs)
    per: dict[str, list[int]] = {}
    for (e, _), ds in zip(jobs, digests, strict=True):
        per.setdefault(e.name, []).extend(ds)
    for e in d.tensors:
        if combine_digests(per.get(e.name, []), e.length, b) != e.payload_xxh3:
            raise DeltaError(f"tensor {e.name!r}: payload checksum mismatch (corrupted delta)")


def _validate(delta: bytes | Delta, base: Mapping[str, BitArray]) -> Delta:
    """Everything that can be checked without decoding: header, table, names, dtypes, shapes, payload checksums."""
    d = delta if isinstance(delta, Delta) else parse(delta)
    _check_names({e.name: e for e in d.tensors}, base, "delta vs base")
    for e in d.tensors:
        _check_base(e, base[e.name])
        if e.encoding == "dense" and e.payload_xxh3 != e.target_xxh3:  # a dense payload is the target itself
            raise DeltaError(f"tensor {e.name!r}: dense payload does not match the target checksum")
    _check_payloads(d)
    return d


def _decode_jobs(d: Delta, entries: list[TensorEntry]) -> list[tuple[_Sparse, bool]]:
    """Two jobs per sparse entry: gap planes -> positions, value planes -> differences."""
    return [(_sparse_start(e, d.payload_of(e)), g) for e in entries if e.encoding == "sparse" for g in (True, False)]


def stage(delta: bytes | Delta, base: Mapping[str, BitArray]) -> tuple[Delta, list[Staged]]:
    """Validate a whole delta against `base`'s names, dtypes and shapes, check every payload checksum and decode
    every payload, touching nothing. Raises DeltaError."""
    d = _validate(delta, base)
    jobs = sorted(_decode_jobs(d, d.tensors), key=lambda j: -j[0].entry.changed)
    halves = dict(zip(((j[0].entry.name, j[1]) for j in jobs), _pmap(_decode_half, jobs), strict=True))
    return d, [_staged(d, e, halves) for e in d.tensors]


def _staged(d: Delta, e: TensorEntry, halves: Mapping[tuple[str, bool], np.ndarray]) -> Staged:
    pair = (halves[(e.name, True)], halves[(e.name, False)]) if e.encoding == "sparse" else None
    return _decoded(e, d.payload_of(e), pair)


class _Job(NamedTuple):
    """One segment of one tensor to write (and hash)."""

    staged: Staged
    old: np.ndarray  # the overwritten bits of the tensor's changes, to roll back (shared by its segments)
    seg: Segment


def _apply(
    delta: bytes | Delta, base: Mapping[str, BitArray], dst: Mapping[str, BitArray], src: bool, verify: bool
) -> Delta:
    """Validate, then decode and write tensor by tensor, biggest first, pipelined on the pool: while the segments
    of one tensor are written (memory-bound), the next tensor is decoded (compute-bound). Sparse and unchanged
    tensors are checked against their targets as they are written; dense ones were checked by their payload
    checksum. On any DeltaError after the first write (a wrong base, or a payload that passed its checksum and
    still fails to decode: a forged delta), every written element is restored exactly before it is raised."""
    d = _validate(delta, base)
    b = d.block_bytes
    todo = [e for e in d.tensors if e.encoding != "dense" and (verify or src or e.encoding == "sparse")]
    todo.sort(key=lambda e: -e.nbytes)
    pool, writes = _pool(), []
    error: Exception | None = None
    # Decoding runs _AHEAD tensors ahead of writing, so a thread never waits on the loop below to queue work.
    pending = {i: [pool.submit(_decode_half, j) for j in _decode_jobs(d, [e])] for i, e in enumerate(todo[:_AHEAD])}
    try:
        for i, e in enumerate(todo):
            halves = [f.result() for f in pending.pop(i)]
            s = _decoded(e, d.payload_of(e), (halves[0], halves[1]) if halves else None)
            bits = dst[e.name].bits
            old = np.empty(0 if s.values is None else s.values.size, dtype=bits.dtype)  # shared by the segments
            segs = [_Job(s, old, seg) for seg in _segs(bits, b)]
            nxt = _decode_jobs(d, todo[i + _AHEAD : i + _AHEAD + 1])
            # This tensor's segments and a later tensor's decoding, interleaved: one thread of each at a time.
            later = []
            for k in range(max(len(segs), len(nxt))):
                if k < len(segs):
                    writes.append((segs[k], pool.submit(_write_job, segs[k], dst, base if src else None, verify, b)))
                if k < len(nxt):
                    later.append(pool.submit(_decode_half, nxt[k]))
            if i + _AHEAD < len(todo):
                pending[i + _AHEAD] = later
    except Exception as err:  # a DeltaError, or anything else: either way nothing may stay half-applied
        error = err
    done = [(j, f.result()) for j, f in writes]
    if error is None and verify:
        error = _check_targets(d, done)
    if error is not None:
        if not src:  # in place: undo every write exactly (a copy is simply dropped)
            written = {j.staged.entry.name: j for j, _ in done if j.staged.idx is not None}
            for name, j in written.items():
                _scan.restore(dst[name].bits, j.staged.idx, j.old)
        raise error
    dense = [(e, seg) for e in d.tensors if e.encoding == "dense" for seg in _segs(dst[e.name].bits, b)]
    _pmap(lambda j: _copy(dst[j[0].name].bits, _dense_bits(d, j[0]), j[1]), dense)
    return d


def _dense_bits(d: Delta, e: TensorEntry) -> np.ndarray:
    return np.frombuffer(d.payload_of(e), dtype=_UINT[e.itemsize])


def _check_targets(d: Delta, done: list[tuple[_Job, list[int]]]) -> Exception | None:
    per: dict[str, list[tuple[int, list[int]]]] = {}
    entries = {}
    for j, ds in done:
        per.setdefault(j.staged.entry.name, []).append((j.seg.start, ds))
        entries[j.staged.entry.name] = j.staged.entry
    bad = [n for n, e in entries.items() if _digest(per[n], e, d.block_bytes) != e.target_xxh3]
    if not bad:
        return None
    return DeltaError(
        f"target checksum mismatch for {_names(bad)}: these weights are not version {d.header.base_version} "
        "(wrong base) or the delta is forged; nothing applied"
    )


def _segs(bits: np.ndarray, block_bytes: int) -> list[Segment]:
    return segments(bits.size, bits.itemsize, _THREADS, block_bytes)


def _copy(dst: np.ndarray, src: np.ndarray, seg: Segment) -> None:
    np.copyto(dst[seg.start : seg.stop], src[seg.start : seg.stop])


def _write_job(
    j: _Job, dst: Mapping[str, BitArray], src: Mapping[str, BitArray] | None, verify: bool, b: int
) -> list[int]:
    s = j.staged
    bits = dst[s.entry.name].bits
    idx = s.idx if s.idx is not None else np.empty(0, dtype=np.int64)
    diff = s.values if s.values is not None else np.empty(0, dtype=bits.dtype)
    return _scan.write_segment(
        bits, idx, diff, j.old, j.seg, b, None if src is None else src[s.entry.name].bits, verify
    )


def _digest(parts: list[tuple[int, list[int]]], entry: TensorEntry, block_bytes: int) -> int:
    return combine_digests([d for _, ds in sorted(parts) for d in ds], entry.nbytes, block_bytes)


def apply_arrays_(base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True) -> Delta:
    """Apply a delta in place. Structure, payload checksums and decoded positions are validated before the first
    write; with `verify_target` every tensor is hashed as it is written and, on a mismatch (a wrong base or a
    forged delta), every written element is restored exactly before DeltaError is raised. Without it nothing
    full-size is read: the caller vouches for the base (e.g. by a whole-state checksum)."""
    return _apply(delta, base, base, False, verify_target)


def apply_arrays(
    base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True
) -> dict[str, BitArray]:
    """Apply a delta to copies of the base arrays (copied, changed and hashed in one pass); the base is untouched."""
    out = {name: BitArray(a.dtype, a.shape, np.empty_like(a.bits)) for name, a in base.items()}
    _apply(delta, base, out, True, verify_target)
    return out
