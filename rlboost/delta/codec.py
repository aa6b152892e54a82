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

Speed (see _scan.py): every tensor is cut into segments, runs of whole hash blocks of about
_SEGMENT_BYTES (checksums are block-wise, see format.tensor_checksum), and each stage hands the
segments of all tensors to a persistent pool of two threads as one queue, biggest first (this
machine's cores; the kernels, xxhash and zstd release the GIL), so one large tensor uses both cores
and many tensors keep both busy. Each worker takes the next job itself (_drain: one thread hand-off per
stage, not one per job), and only a tensor that is a large share of the state is split for the threads
(must_split): a model's ~100 small tensors are one segment each. Encode reads each base/new pair once, scanning and hashing it chunk
by chunk in cache, then builds and compresses each segment's byte planes as that segment's own
streams (format 3). Apply checks the structure and every payload checksum before the first write;
then each job decodes one segment (positions inside it, no empty change) and right away writes it
and hashes it block by block on the same thread, while the other thread does the same with another
segment: no serial decode before the first write, and one pass over memory. A job is one compiled call
that never takes the GIL (_apply_kernel: libzstd called from compiled code), with the Python path
(decode_span, then _scan.write_segment) as the fallback and the source of every error message.
The target checksum also proves the base: the delta maps a base to its target bijectively
(fixed positions, fixed modular differences), so the result matches the target's checksum only
if the base was the delta's base. On a mismatch, or on a segment that passed its payload checksum
yet fails to decode (a forged delta) after other segments were written, every written element is
restored exactly before DeltaError is raised, so a bad delta or a wrong base never leaves half-applied weights.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import numpy as np
import zstandard

from rlboost.delta import _apply_kernel, _scan
from rlboost.delta._scan import Segment, SegScan, fill_planes, gap_planes_for, max_gap, segments
from rlboost.delta.format import (
    DEFAULT_BLOCK_BYTES,
    DTYPE_ITEMSIZE,
    Delta,
    DeltaError,
    SegmentEntry,
    Span,
    TensorEntry,
    block_digests,
    check_block_bytes,
    combine_digests,
    pack,
    parse,
    tensor_checksum,
)

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# Level 1 (levels 1..19 give the same size on these planes), matches of at least 7 bytes: on a real step's planes
# 0.8% smaller, compressed 35% and decompressed ~10% faster than level 1's defaults (measured, docs/benchmarks.md).
# The planes are near-random bytes; short matches only cost sequences to decode.
_ZSTD_PARAMS = {"compression_level": 1, "min_match": 7, "strategy": zstandard.STRATEGY_FAST}
_THREADS = 2  # this machine's cores: the kernels, xxhash and zstd release the GIL
_T = TypeVar("_T")
_R = TypeVar("_R")
_POOL: tuple[int, ThreadPoolExecutor] | None = None
_LOCAL = threading.local()
_SEGMENT_BYTES = 4 << 20  # target segment size (whole hash blocks): see plan() and docs/benchmarks.md
_INLINE_HASH_BYTES = 8 << 20  # payloads up to this are checksummed on the calling thread (~1 ms at 8 GB/s)


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


def _drain(fn: Callable[[_T], _R], items: list[_T]) -> tuple[list[_R | None], BaseException | None]:
    """fn over items, in list order, by _THREADS workers: the calling thread and the pool's others. Each worker
    takes the next item itself, so a stage costs one thread hand-off, not one per item (a future per item
    measured ~0.1 ms each on a model's hundreds of small segments). After the first exception no worker starts
    another item. Returns the results (None for items not run) and that exception."""
    out: list[_R | None] = [None] * len(items)
    nxt = itertools.count()  # next() on a count is atomic under the GIL
    error: list[BaseException] = []

    def work() -> None:
        for i in iter(nxt.__next__, None):
            if i >= len(items) or error:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as err:  # noqa: BLE001 - handed to the caller, which raises it
                error.append(err)
                return

    helpers = [_pool().submit(work) for _ in range(min(_THREADS, len(items)) - 1)]
    work()
    for h in helpers:
        h.result()
    return out, error[0] if error else None


def _pmap(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """fn over items on the pool (in order; the first exception is raised). Jobs must not call _pmap."""
    items = list(items)
    if len(items) <= 1:
        return [fn(x) for x in items]
    out, error = _drain(fn, items)
    if error is not None:
        raise error
    return out  # type: ignore[return-value]  # no error: every item ran


# ---------------------------------------------------------------- segments and sparse streams


def plan(size: int, itemsize: int, block_bytes: int, split: bool = True) -> tuple[Segment, ...]:
    """A tensor's segments: runs of whole hash blocks of about _SEGMENT_BYTES each, and with `split` at least two
    when it has two blocks (so one large tensor keeps both threads busy). The unit of every stage's work."""
    per = _scan.block_elems(itemsize, block_bytes)
    blocks = -(-size // per)
    per_segment = max(1, _SEGMENT_BYTES // (per * itemsize))
    least = min(_THREADS, blocks) if split else 1
    return segments(size, itemsize, max(least, -(-blocks // per_segment)), block_bytes)


def must_split(nbytes: int, total: int) -> bool:
    """Whether a tensor of `nbytes` in a state of `total` bytes needs at least two segments: only a large share
    of the state does. A model's many small tensors already keep both threads busy, and each extra segment costs
    a job, a table entry and a set of zstd frames (measured: ~150 segments for 91 tensors instead of ~95)."""
    return nbytes * 2 * _THREADS > total


def _zstd() -> threading.local:
    """This thread's zstd (de)compressor: a fresh context per stream allocates and first-touches its tables
    every time (measured ~0.2 ms per stream, most of the time of a model's many small tensors). Contexts are
    not thread-safe, hence one per thread."""
    if not hasattr(_LOCAL, "cctx"):
        _LOCAL.cctx = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(**_ZSTD_PARAMS))
        _LOCAL.dctx = zstandard.ZstdDecompressor()
    return _LOCAL


def _compress(plane: np.ndarray) -> bytes:
    """A plane's stream: a zstd frame, or the raw plane when zstd would not make it smaller (format 4: a stream
    as long as its plane is raw). A tiny tensor's planes are a few bytes; a frame's header alone costs ~9."""
    frame = _zstd().cctx.compress(plane)
    return frame if len(frame) < plane.size else plane.tobytes()


def _decompress(frame: bytes | memoryview, size: int, what: str) -> np.ndarray:
    """A plane of `size` bytes (read-only, no copy) from its stream: raw when the stream is `size` bytes long,
    else one zstd frame that must declare exactly that size."""
    if len(frame) == size:
        return np.frombuffer(frame, dtype=np.uint8)
    try:
        declared = zstandard.frame_content_size(frame)
        if declared != size:
            raise DeltaError(f"{what}: stream declares {declared} bytes, expected {size}")
        data = _zstd().dctx.decompress(frame, max_output_size=size)
    except zstandard.ZstdError as e:
        raise DeltaError(f"{what}: corrupt compressed stream ({e})") from None
    if len(data) != size:
        raise DeltaError(f"{what}: stream decompressed to {len(data)} bytes, expected {size}")
    return np.frombuffer(data, dtype=np.uint8)


def encode_segment(idx: np.ndarray, diff: np.ndarray, seg: Segment) -> tuple[SegmentEntry, bytes]:
    """The table entry and payload of one segment's changes (positions absolute, inside `seg`, sorted)."""
    if not idx.size:
        return SegmentEntry(stop=seg.stop, changed=0), b""
    gap_planes = gap_planes_for(max_gap(idx, seg.start - 1))  # positions count from the segment's start
    planes = np.empty((gap_planes + diff.itemsize, idx.size), dtype=np.uint8)
    fill_planes(idx, diff, seg.start - 1, gap_planes, planes, 0)
    streams = [_compress(p) for p in planes]
    entry = SegmentEntry(stop=seg.stop, changed=int(idx.size), gap_planes=gap_planes, streams=[len(s) for s in streams])
    return entry, b"".join(streams)


def encode_sparse(
    idx: np.ndarray, diff: np.ndarray, numel: int, itemsize: int, block_bytes: int, split: bool = True
) -> tuple[list[SegmentEntry], bytes]:
    """The segments and payload of a sparse tensor from all its sorted positions and modular differences (`split`:
    see plan and must_split)."""
    segs = plan(numel, itemsize, block_bytes, split)
    cuts = np.searchsorted(idx, [*(s.start for s in segs), numel]).tolist()
    parts = _pmap(
        lambda i: encode_segment(idx[cuts[i] : cuts[i + 1]], diff[cuts[i] : cuts[i + 1]], segs[i]), range(len(segs))
    )
    return [e for e, _ in parts], b"".join(p for _, p in parts)


def decode_span(entry: TensorEntry, span: Span, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """One segment's positions (relative to its start: strictly increasing, inside it) and its modular differences
    (none zero), from the tensor's (checksummed) payload. Raises DeltaError."""
    seg, where = span.seg, f"tensor {entry.name!r}"
    if not seg.changed:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=_UINT[entry.itemsize])
    planes, offset = [], span.offset
    for i, n in enumerate(seg.streams):
        planes.append(
            _decompress(payload[offset : offset + n], seg.changed, f"{where} (segment at {span.start}) stream {i}")
        )
        offset += n
    idx, ok = _scan.read_positions(planes, seg.gap_planes, span.stop - span.start)
    if not ok:
        raise DeltaError(f"{where}: positions run past the end of the segment [{span.start}, {span.stop})")
    diff, ok = _scan.read_values(planes, seg.gap_planes, _UINT[entry.itemsize])
    if not ok:
        raise DeltaError(f"{where}: a listed change leaves its element unchanged (segment at {span.start})")
    return idx, diff


def decode_sparse(entry: TensorEntry, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Positions (int64, absolute, strictly increasing, in range) and modular differences of a sparse entry."""
    spans = [s for s in entry.spans() if s.seg.changed]
    parts = _pmap(lambda s: decode_span(entry, s, payload), spans)
    idx = np.concatenate([p[0] + s.start for s, p in zip(spans, parts, strict=True)] or [np.empty(0, np.int64)])
    diff = np.concatenate([p[1] for p in parts] or [np.empty(0, dtype=_UINT[entry.itemsize])])
    return idx, diff


# ---------------------------------------------------------------- encode


class _Pair(NamedTuple):
    name: str
    old: BitArray
    new: BitArray
    segs: tuple[Segment, ...]


def _plan_of(bits: np.ndarray, block_bytes: int, total: int) -> tuple[Segment, ...]:
    return plan(bits.size, bits.itemsize, block_bytes, must_split(bits.nbytes, total))


def _entry(name: str, new: BitArray, scan: _scan.Scan, **fields: object) -> TensorEntry:
    # Built (and validated) once, with its offset and segments: a model_copy per field measured ~40 us a tensor.
    return TensorEntry(
        name=name,
        dtype=new.dtype,
        shape=list(new.shape),
        base_xxh3=scan.base_xxh3,
        target_xxh3=scan.target_xxh3,
        changed=scan.changed,
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
    name: str, new: BitArray, scan: _scan.Scan, sparse: list[tuple[SegmentEntry, bytes]] | None, b: int, offset: int
) -> tuple[TensorEntry, bytes]:
    """The table entry (its payload at `offset`) and payload of one tensor: unchanged, sparse, or dense when
    sparse is not smaller."""
    if scan.changed == 0:
        checksum = tensor_checksum(b"", b)
        return _entry(name, new, scan, encoding="unchanged", offset=offset, length=0, payload_xxh3=checksum), b""
    if sparse is not None:
        payload = b"".join(p for _, p in sparse)
        if len(payload) < new.bits.nbytes:
            checksum = tensor_checksum(payload, b)
            segs = [s for s, _ in sparse]
            fields = {"offset": offset, "length": len(payload), "payload_xxh3": checksum, "segments": segs}
            return _entry(name, new, scan, encoding="sparse", **fields), payload
    payload = new.bits.tobytes()
    # The dense payload is the target itself: its checksum is already known.
    fields = {"offset": offset, "length": len(payload), "payload_xxh3": scan.target_xxh3}
    return _entry(name, new, scan, encoding="dense", **fields), payload


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


def sparse_limit(size: int) -> int:
    """The most changes a segment of `size` elements may hold and still be sent sparse: past a quarter of the
    elements changed, sparse rarely wins and its index arrays grow large (the tensor then goes dense)."""
    return size // 4


def _scan_job(pair: _Pair, seg: Segment, block_bytes: int) -> SegScan:
    return _scan.scan_segment(pair.old.bits, pair.new.bits, seg, sparse_limit(seg.stop - seg.start), block_bytes)


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
    total = sum(new[n].bits.nbytes for n in names)
    pairs = {n: _Pair(n, base[n], new[n], _plan_of(new[n].bits, block_bytes, total)) for n in names}
    # Every segment of every tensor is one scan job, biggest first so the two threads finish together.
    jobs = sorted(((p, s) for p in pairs.values() for s in p.segs), key=lambda j: j[1].start - j[1].stop)
    scans = _pmap(lambda j: _scan_job(j[0], j[1], block_bytes), jobs)
    by_seg = {(j[0].name, j[1].start): s for j, s in zip(jobs, scans, strict=True)}
    joined = {n: _joined(p, [by_seg[(n, s.start)] for s in p.segs], block_bytes) for n, p in pairs.items()}
    # Every segment of a sparse tensor is one job (byte planes, then zstd of each): its own stream group.
    sparse = [
        (n, seg, sc)
        for n in names
        if joined[n][1] is not None
        for seg, sc in zip(pairs[n].segs, joined[n][1], strict=True)
    ]
    sparse.sort(key=lambda j: -j[2].changed)
    encoded = _pmap(lambda j: encode_segment(j[2].idx, j[2].diff, j[1]), sparse)
    groups: dict[str, dict[int, tuple[SegmentEntry, bytes]]] = {}
    for (name, seg, _), part in zip(sparse, encoded, strict=True):
        groups.setdefault(name, {})[seg.start] = part
    entries, parts, offset = [], [], 0
    for name in names:
        got = groups.get(name)
        ordered = [got[s.start] for s in pairs[name].segs] if got is not None else None
        entry, payload = _finish_tensor(name, new[name], joined[name][0], ordered, block_bytes, offset)
        entries.append(entry)
        parts.append(payload)
        offset += len(payload)
    return pack(base_version, version, entries, parts, block_bytes)


# ---------------------------------------------------------------- size bound before encoding
_COUNT_CHUNK = 1 << 16  # elements counted per compiled call between the early-exit checks


def _certainly_dense(old: np.ndarray, new: np.ndarray) -> bool:
    """Whether more than sparse_limit(numel) elements differ: then some segment passes its own limit (the segments'
    limits sum to at most that) and encode_arrays sends the tensor dense, whole. Stops counting as soon as it is
    decided either way."""
    need, size, changed = sparse_limit(old.size) + 1, old.size, 0
    for start in range(0, size, _COUNT_CHUNK):
        if changed >= need or changed + size - start < need:
            break
        changed += _scan._count(old[start : start + _COUNT_CHUNK], new[start : start + _COUNT_CHUNK])
    return changed >= need


def certainly_exceeds(base: Mapping[str, BitArray], new: Mapping[str, BitArray], nbytes: float) -> bool:
    """Whether encode_arrays(base, new) is certain to be larger than `nbytes`, from a count of changed elements and
    no encode: the tensors it will send dense, whole, already hold more. False when undecided (or when the states do
    not match: encode_arrays says how). Biggest tensors first; stops once decided, so on a dense update it reads
    about a quarter of each tensor it counts."""
    if set(base) != set(new) or any(
        base[n].dtype != new[n].dtype or tuple(base[n].shape) != tuple(new[n].shape) for n in new
    ):
        return False
    names = sorted(new, key=lambda n: -new[n].bits.nbytes)
    dense, left = 0, sum(new[n].bits.nbytes for n in names)
    for name in names:
        if dense > nbytes or dense + left <= nbytes:
            break
        left -= new[name].bits.nbytes
        if _certainly_dense(base[name].bits, new[name].bits):
            dense += new[name].bits.nbytes
    return dense > nbytes


# ---------------------------------------------------------------- apply


def decode_entry(delta: Delta, entry: TensorEntry) -> Staged:
    """Check a tensor's payload checksum and decode it: positions and differences, or the dense new bits."""
    payload = delta.payload_of(entry)
    if tensor_checksum(payload, delta.block_bytes) != entry.payload_xxh3:
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


def _check_payloads(d: Delta) -> None:
    """Every payload checksum, the blocks of large payloads split over the threads (a step's sparse payloads are
    ~1 MB, hashed in ~0.1 ms: on one thread, as the pool's hand-offs would cost more)."""
    b = d.block_bytes
    if len(d.payload) <= _INLINE_HASH_BYTES:
        for e in d.tensors:
            if tensor_checksum(d.payload_of(e), b) != e.payload_xxh3:
                raise DeltaError(f"tensor {e.name!r}: payload checksum mismatch (corrupted delta)")
        return
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


_NO_CHANGE = SegmentEntry(stop=0, changed=0)  # the segments of an unchanged tensor: hashed or copied, not written


class _Job(NamedTuple):
    """One segment of one tensor: decode its changes (if any), then write and hash it, on one thread."""

    entry: TensorEntry
    span: Span  # an unchanged tensor's segments get spans without changes


class _Done(NamedTuple):
    """A written segment: its changes' positions (relative to its start) and overwritten bits, block digests."""

    idx: np.ndarray
    old: np.ndarray
    digests: list[int]


def _jobs(d: Delta, verify: bool, copy: bool) -> list[_Job]:
    """Every segment that needs work (changes to write, blocks to hash or copy), biggest first."""
    jobs, total = [], sum(e.nbytes for e in d.tensors)
    for e in d.tensors:
        if e.encoding == "sparse":
            jobs += [_Job(e, s) for s in e.spans() if s.seg.changed or verify or copy]
        elif e.encoding == "unchanged" and (verify or copy):
            split = must_split(e.nbytes, total)
            jobs += [
                _Job(e, Span(s.start, s.stop, 0, _NO_CHANGE)) for s in plan(e.numel, e.itemsize, d.block_bytes, split)
            ]
    jobs.sort(key=lambda j: j.span.start - j.span.stop)
    return jobs


def _run_job(
    job: _Job, d: Delta, dst: Mapping[str, BitArray], src: Mapping[str, BitArray] | None, verify: bool
) -> _Done:
    """Decode one segment (validating every position and difference) and only then write it, hashing each block
    as it is written (in cache); a segment that fails to decode writes nothing."""
    e, sp = job
    bits = dst[e.name].bits[sp.start : sp.stop]
    copy = None if src is None else src[e.name].bits[sp.start : sp.stop]
    if _apply_kernel.AVAILABLE:
        return _run_compiled(e, sp, d, bits, copy, verify)
    idx, diff = decode_span(e, sp, d.payload_of(e))
    old = np.empty(diff.size, dtype=bits.dtype)
    digests = _scan.write_segment(bits, idx, diff, old, Segment(0, bits.size), d.block_bytes, copy, verify)
    return _Done(idx, old, digests)


def _run_compiled(e: TensorEntry, sp: Span, d: Delta, bits: np.ndarray, copy: np.ndarray | None, verify: bool) -> _Done:
    """_run_job as one compiled call without the GIL (see _apply_kernel); a segment it cannot decode is decoded
    again on the Python path, which raises the DeltaError that names the fault."""
    seg, payload = sp.seg, d.payload_of(e)
    data = np.frombuffer(payload, dtype=np.uint8)
    data.flags.writeable = False  # bytes and bytearray payloads alike: one compiled variant, not two
    status, idx, old, digests = _apply_kernel.apply_segment(
        _apply_kernel.dctx(),
        data,
        sp.offset,
        np.array(seg.streams, dtype=np.int64),
        seg.changed,
        seg.gap_planes,
        bits,
        bits if copy is None else copy,
        copy is not None,
        _scan.block_elems(bits.itemsize, d.block_bytes),
        verify,
        seg.changed > _scan.SAFE_SUM // max(bits.size, 1),
    )
    if status != _apply_kernel.OK:
        decode_span(e, sp, payload)
        raise DeltaError(f"tensor {e.name!r}: segment at {sp.start} does not decode (status {status})")
    return _Done(idx, old, digests.tolist())


def _apply(
    delta: bytes | Delta, base: Mapping[str, BitArray], dst: Mapping[str, BitArray], src: bool, verify: bool
) -> Delta:
    """Validate (structure, payload checksums), then run every segment of every tensor as one job on the pool,
    biggest first: each job decodes its segment and then writes and hashes it, so decoding overlaps writing on
    both cores and nothing waits for a serial decode. Sparse and unchanged tensors are checked against their
    targets from the jobs' block digests; dense ones were checked by their payload checksum. On any error after
    the first write (a wrong base, or a payload that passed its checksum and still fails to decode: a forged
    delta), every written element is restored exactly before it is raised."""
    d = _validate(delta, base)
    jobs = _jobs(d, verify, src)
    # A DeltaError, or anything else: either way nothing may stay half-applied. A job that raised wrote nothing
    # (it decodes fully before writing); jobs not started after the first error are skipped.
    results, error = _drain(lambda j: _run_job(j, d, dst, base if src else None, verify), jobs)
    done = [(j, r) for j, r in zip(jobs, results, strict=True) if r is not None]
    if error is None and verify:
        error = _check_targets(d, done)
    if error is not None:
        if not src:  # in place: undo every write exactly (a copy is simply dropped)
            for j, r in done:
                _scan.restore(dst[j.entry.name].bits[j.span.start : j.span.stop], r.idx, r.old)
        raise error
    dense = [(e, seg) for e in d.tensors if e.encoding == "dense" for seg in plan(e.numel, e.itemsize, d.block_bytes)]
    _pmap(lambda j: _copy(dst[j[0].name].bits, _dense_bits(d, j[0]), j[1]), dense)
    return d


def _dense_bits(d: Delta, e: TensorEntry) -> np.ndarray:
    return np.frombuffer(d.payload_of(e), dtype=_UINT[e.itemsize])


def _check_targets(d: Delta, done: list[tuple[_Job, _Done]]) -> Exception | None:
    per: dict[str, list[tuple[int, list[int]]]] = {}
    entries = {}
    for j, r in done:
        per.setdefault(j.entry.name, []).append((j.span.start, r.digests))
        entries[j.entry.name] = j.entry
    bad = [n for n, e in entries.items() if _digest(per[n], e, d.block_bytes) != e.target_xxh3]
    if not bad:
        return None
    return DeltaError(
        f"target checksum mismatch for {_names(bad)}: these weights are not version {d.header.base_version} "
        "(wrong base) or the delta is forged; nothing applied"
    )


def _copy(dst: np.ndarray, src: np.ndarray, seg: Segment) -> None:
    np.copyto(dst[seg.start : seg.stop], src[seg.start : seg.stop])


def _digest(parts: list[tuple[int, list[int]]], entry: TensorEntry, block_bytes: int) -> int:
    return combine_digests([d for _, ds in sorted(parts) for d in ds], entry.nbytes, block_bytes)


def apply_arrays_(base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True) -> Delta:
    """Apply a delta in place. Structure and payload checksums are validated before the first write, and each
    segment's positions and differences before that segment is written; with `verify_target` every tensor is
    hashed as it is written and, on a mismatch (a wrong base or a forged delta), or on a later segment that fails
    to decode, every written element is restored exactly before DeltaError is raised. Without it nothing
    full-size is read: the caller vouches for the base (e.g. by a whole-state checksum)."""
    return _apply(delta, base, base, False, verify_target)


def apply_arrays(
    base: Mapping[str, BitArray], delta: bytes | Delta, *, verify_target: bool = True
) -> dict[str, BitArray]:
    """Apply a delta to copies of the base arrays (copied, changed and hashed in one pass); the base is untouched."""
    out = {name: BitArray(a.dtype, a.shape, np.empty_like(a.bits)) for name, a in base.items()}
    _apply(delta, base, out, True, verify_target)
    return out
