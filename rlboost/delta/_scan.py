"""Compiled kernels of the delta codec (numba, `nogil`) and the block-wise passes built on them.

Every tensor is cut into fixed-size hash blocks (the delta header's `hash_block_bytes`); a tensor's
checksum is derived from the xxh3 of each block (format.tensor_checksum), so one tensor's blocks
can be scanned, written and hashed by several threads at once: a `Segment` is a run of whole
blocks, and the codec hands the segments of all tensors to its thread pool.

Encode reads a segment's base and new blocks once, in cache-sized chunks: each chunk is scanned for
changed elements and then hashed (xxh3, both tensors) while it is still in cache, so the memory
traffic is that of reading both tensors once. The scan compares 64 elements at a time with one
vector compare whose lane mask becomes a 64-bit integer (an LLVM intrinsic: the `vpcmpneq` + `kmov`
pair on AVX-512, a compare + movemask on AVX2), then walks the set bits with count-trailing-zeros,
emitting the position and the modular difference `new - old` of each changed element.

Apply writes a segment's changes block by block and hashes each block right after writing it, again
one pass over memory, in one compiled call per segment (`_write_blocks`): the hash is the xxhash
extension's own XXH3_64bits, called from compiled code, so a segment costs no GIL hand-overs (each
one is a wait while the other thread holds the GIL). The per-change arrays (positions, differences, byte planes) are built and read
by single loops over the changes that the compiler vectorises (~0.3-0.6 ns per change).

xxhash releases the GIL while hashing and the kernels run without it: two threads use both cores.
Compiled code is cached on disk (numba `cache=True`), so only the first process pays the JIT.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np
import xxhash
import xxhash._xxhash
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from rlboost.delta.format import DEFAULT_BLOCK_BYTES, combine_digests

CHUNK_BYTES = 1 << 20  # per tensor and chunk: a written chunk is hashed from L2 (2 MiB per core); 1 MiB measured best
_LANES = 64  # elements per vector compare: one 64-bit mask
_PREFETCH = 32  # changes ahead to prefetch in _write (measured: 16 and 64 are slower)
SAFE_SUM = 1 << 62  # changes * numel below this: a sum of gaps (each < numel) cannot overflow int64


@intrinsic
def _neq_mask64(typingctx, a, b, start):  # pragma: no cover - compiled
    """A uint64 whose bit j says a[start + j] != b[start + j] (one vector compare, no branches)."""
    sig = types.uint64(a, b, start)

    def codegen(context, builder, signature, args):
        arr_a, arr_b, s = args
        vty = ir.VectorType(context.get_data_type(signature.args[0].dtype), _LANES)
        pa = builder.gep(context.make_array(signature.args[0])(context, builder, arr_a).data, [s])
        pb = builder.gep(context.make_array(signature.args[1])(context, builder, arr_b).data, [s])
        va = builder.load(builder.bitcast(pa, vty.as_pointer()), align=1)
        vb = builder.load(builder.bitcast(pb, vty.as_pointer()), align=1)
        return builder.bitcast(builder.icmp_unsigned("!=", va, vb), ir.IntType(_LANES))

    return sig, codegen


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _scan(o, n, first, idx, diff, k):  # pragma: no cover - compiled
    """Append the positions (+first) and differences n - o of o != n to idx/diff from slot k; returns the new k."""
    blocks = o.size // 64
    for b in range(blocks):
        s = b * 64
        mask = _neq_mask64(o, n, s)
        while mask != 0:
            p = s + trailing_zeros(mask)
            idx[k] = first + p
            diff[k] = n[p] - o[p]  # stored at the element width: wraps, exact on bit patterns
            k += 1
            mask &= mask - np.uint64(1)
    for p in range(blocks * 64, o.size):
        if o[p] != n[p]:
            idx[k] = first + p
            diff[k] = n[p] - o[p]
            k += 1
    return k


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _count(o, n):  # pragma: no cover - compiled
    """Number of elements with o != n."""
    c = 0
    for p in range(o.size):
        c += o[p] != n[p]
    return c


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _max_gap(idx, prev):  # pragma: no cover - compiled
    """Largest idx[i] - idx[i-1] - 1, the first gap taken from `prev` (-1 for a tensor's first change)."""
    top = np.int64(0)
    for i in range(idx.size):
        top = max(top, idx[i] - prev - 1)
        prev = idx[i]
    return top


# The plane kernels take every plane as its own 1-D array (unused ones repeat plane 0) and test the plane
# count inside the loop: the test is loop-invariant, so the compiler hoists it and vectorises each variant.
# A loop over the planes inside the element loop measured 5-10x slower (~3 ns per change instead of ~0.4).


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _fill_gaps(idx, prev, n, g0, g1, g2, g3, g4, g5, g6, g7):  # pragma: no cover - compiled
    """Gap byte planes of idx[i] - idx[i-1] - 1 (the first from `prev`): n planes into g0..g7."""
    for i in range(idx.size):
        g = np.uint64(idx[i] - (prev if i == 0 else idx[i - 1]) - 1)
        g0[i] = np.uint8(g & np.uint64(0xFF))
        if n > 1:
            g1[i] = np.uint8((g >> np.uint64(8)) & np.uint64(0xFF))
        if n > 2:
            g2[i] = np.uint8((g >> np.uint64(16)) & np.uint64(0xFF))
        if n > 3:
            g3[i] = np.uint8((g >> np.uint64(24)) & np.uint64(0xFF))
        if n > 4:
            g4[i] = np.uint8((g >> np.uint64(32)) & np.uint64(0xFF))
        if n > 5:
            g5[i] = np.uint8((g >> np.uint64(40)) & np.uint64(0xFF))
        if n > 6:
            g6[i] = np.uint8((g >> np.uint64(48)) & np.uint64(0xFF))
        if n > 7:
            g7[i] = np.uint8((g >> np.uint64(56)) & np.uint64(0xFF))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _fill_values(diff, n, v0, v1, v2, v3, v4, v5, v6, v7):  # pragma: no cover - compiled
    """Byte planes of zigzag(diff) at the element width (n bytes) into v0..v7."""
    top = np.uint64(8 * n - 1)
    full = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - 8 * n)
    for i in range(diff.size):
        d = np.uint64(diff[i])
        z = ((d << np.uint64(1)) ^ (np.uint64(0) - ((d >> top) & np.uint64(1)))) & full  # zigzag at the width
        v0[i] = np.uint8(z & np.uint64(0xFF))
        if n > 1:
            v1[i] = np.uint8((z >> np.uint64(8)) & np.uint64(0xFF))
        if n > 2:
            v2[i] = np.uint8((z >> np.uint64(16)) & np.uint64(0xFF))
            v3[i] = np.uint8((z >> np.uint64(24)) & np.uint64(0xFF))
        if n > 4:
            v4[i] = np.uint8((z >> np.uint64(32)) & np.uint64(0xFF))
            v5[i] = np.uint8((z >> np.uint64(40)) & np.uint64(0xFF))
            v6[i] = np.uint8((z >> np.uint64(48)) & np.uint64(0xFF))
            v7[i] = np.uint8((z >> np.uint64(56)) & np.uint64(0xFF))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _read_gaps(n, g0, g1, g2, g3, g4, g5, g6, g7, idx, sum_up):  # pragma: no cover - compiled
    """The gaps from n byte planes into idx, as positions (their running sum + 1 each) when `sum_up`.
    Returns the largest gap. Summing needs no check per step: the caller checks the largest gap against
    the tensor and makes sure the sum cannot overflow (else it sums with _positions_checked)."""
    top = np.uint64(0)
    pos = np.uint64(0)
    for i in range(idx.size):
        g = np.uint64(g0[i])
        if n > 1:
            g |= np.uint64(g1[i]) << np.uint64(8)
        if n > 2:
            g |= np.uint64(g2[i]) << np.uint64(16)
        if n > 3:
            g |= np.uint64(g3[i]) << np.uint64(24)
        if n > 4:
            g |= np.uint64(g4[i]) << np.uint64(32)
        if n > 5:
            g |= np.uint64(g5[i]) << np.uint64(40)
        if n > 6:
            g |= np.uint64(g6[i]) << np.uint64(48)
        if n > 7:
            g |= np.uint64(g7[i]) << np.uint64(56)
        top = max(top, g)
        if sum_up:
            pos += g + np.uint64(1)
            idx[i] = np.int64(pos) - 1
        else:
            idx[i] = np.int64(g)
    return top


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _positions_checked(idx, numel):  # pragma: no cover - compiled
    pos = np.int64(-1)
    for i in range(idx.size):
        g = np.uint64(idx[i])
        # Compare before adding so a huge gap cannot wrap the position around.
        if g >= np.uint64(numel - 1 - pos):
            return 1
        pos += np.int64(g) + 1
        idx[i] = pos
    return 0


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _read_values(n, v0, v1, v2, v3, v4, v5, v6, v7, diff):  # pragma: no cover - compiled
    """Modular differences from n value planes; returns 0, or 2 if one is zero (a change that changes nothing)."""
    zeros = 0
    for i in range(diff.size):
        z = np.uint64(v0[i])
        if n > 1:
            z |= np.uint64(v1[i]) << np.uint64(8)
        if n > 2:
            z |= (np.uint64(v2[i]) << np.uint64(16)) | (np.uint64(v3[i]) << np.uint64(24))
        if n > 4:
            z |= (np.uint64(v4[i]) << np.uint64(32)) | (np.uint64(v5[i]) << np.uint64(40))
            z |= (np.uint64(v6[i]) << np.uint64(48)) | (np.uint64(v7[i]) << np.uint64(56))
        zeros += z == 0
        diff[i] = (z >> np.uint64(1)) ^ (np.uint64(0) - (z & np.uint64(1)))  # unzigzag; truncated at the width
    return 2 if zeros else 0


@intrinsic
def _prefetch(typingctx, a, i):  # pragma: no cover - compiled
    """Hint the cache line of a[i] into cache for writing (llvm.prefetch; no effect on results)."""
    sig = types.void(a, i)

    def codegen(context, builder, signature, args):
        arr, idx = args
        ptr = builder.gep(context.make_array(signature.args[0])(context, builder, arr).data, [idx])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8"
        )
        # rw=1 (write), locality=3 (keep in all levels), cache type=1 (data)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _write(bits, idx, diff, old, i, end):  # pragma: no cover - compiled
    """Changes i..end-1: remember the old bits, add the difference. The element _PREFETCH changes ahead is
    prefetched: the writes land on ~40% of all cache lines in an irregular pattern the hardware prefetcher
    misses, and waiting on each line measured twice as slow (14 ms instead of 7 for 830k changes)."""
    for j in range(i, end):
        if j + _PREFETCH < end:
            _prefetch(bits, idx[j + _PREFETCH])
        p = idx[j]
        old[j] = bits[p]
        bits[p] = bits[p] + diff[j]
    return end


def _export_xxh3() -> bool:
    """Make the xxhash extension's own XXH3_64bits callable from compiled code (by symbol name, so numba's disk
    cache stays valid): a block hashed inside the write kernel costs no GIL hand-over. False if not exported."""
    try:
        lib = ctypes.CDLL(xxhash._xxhash.__file__)
    except OSError:
        return False
    # The _dispatch variant picks the widest vector unit at run time, like the Python API (plain XXH3_64bits is
    # the baseline SSE2 build: measured 20% slower here).
    for name in ("XXH3_64bits_dispatch", "XXH3_64bits"):
        fn = getattr(lib, name, None)
        if fn is not None:
            binding.add_symbol("rlboost_xxh3_64", ctypes.cast(fn, ctypes.c_void_p).value)
            return True
    return False


_HAVE_XXH3 = _export_xxh3()


@intrinsic
def _xxh3(typingctx, a, start, stop):  # pragma: no cover - compiled
    """xxh3-64 of the bytes of a[start:stop] (the xxhash extension's own XXH3_64bits: same function, same digest)."""
    sig = types.uint64(a, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        arr, s, e = args
        width = ir.Constant(ir.IntType(64), signature.args[0].dtype.bitwidth // 8)
        ptr = builder.gep(context.make_array(signature.args[0])(context, builder, arr).data, [s])
        i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i8p, i64]), "rlboost_xxh3_64")
        return builder.call(fn, [builder.bitcast(ptr, i8p), builder.mul(builder.sub(e, s), width)])

    return sig, codegen


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _write_blocks(bits, idx, diff, old, per, src, copy, digests):  # pragma: no cover - compiled
    """Block by block of `bits` (`per` elements each): copy src into it when `copy`, add its changes (sorted
    positions idx into bits), then hash it while it is in cache into digests[block]. One call, no GIL."""
    j = 0
    for b in range(digests.size):
        s = b * per
        e = min(s + per, bits.size)
        if copy:
            bits[s:e] = src[s:e]
        k = j
        while k < idx.size and idx[k] < e:
            k += 1
        _write(bits, idx, diff, old, j, k)
        j = k
        digests[b] = _xxh3(bits, s, e)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _restore(bits, idx, old):  # pragma: no cover - compiled
    for i in range(idx.size):
        bits[idx[i]] = old[i]


# ---------------------------------------------------------------- segments: runs of whole hash blocks


class Segment(NamedTuple):
    """Elements [start, stop) of a tensor: whole hash blocks (the last one may be short)."""

    start: int
    stop: int


def block_elems(itemsize: int, block_bytes: int) -> int:
    return max(1, block_bytes // itemsize)


@functools.lru_cache(maxsize=4096)
def segments(size: int, itemsize: int, parts: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> tuple[Segment, ...]:
    """Split `size` elements into at most `parts` runs of whole blocks, as even as blocks allow. Cached: a model's
    tensors share a few shapes, and apply plans every tensor's segments per delta (hence a tuple)."""
    per = block_elems(itemsize, block_bytes)
    blocks = -(-size // per)
    parts = max(1, min(parts, blocks))
    cuts = [min(size, (blocks * i // parts) * per) for i in range(parts + 1)]
    return tuple(Segment(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a) or (Segment(0, size),)


def _chunk(itemsize: int, block: int) -> int:
    """Elements per chunk: the whole block when it is at most CHUNK_BYTES (then hashed with one call, which
    releases the GIL; a streaming xxh3 object's update measured to scale worse over two threads), else a
    multiple of the vector width that divides the block (or the whole block)."""
    step = max(_LANES, CHUNK_BYTES // itemsize // _LANES * _LANES)
    return block if block <= step or block % step else step


def _digest(chunks: list[np.ndarray]) -> int:
    if len(chunks) == 1:
        return xxhash.xxh3_64_intdigest(chunks[0])
    h = xxhash.xxh3_64()
    for c in chunks:
        h.update(c)
    return h.intdigest()


class SegScan(NamedTuple):
    """One pass over a segment of a base/new pair: changes (None past the limit), count, block digests."""

    idx: np.ndarray | None
    diff: np.ndarray | None
    changed: int
    base_blocks: list[int]
    target_blocks: list[int]


def scan_segment(old: np.ndarray, new: np.ndarray, seg: Segment, limit: int, block_bytes: int) -> SegScan:
    """Positions and differences of changed elements in `seg`, and the xxh3 of each of its blocks in both arrays,
    in one pass over memory. Past `limit` changes only the count is kept."""
    per = block_elems(old.itemsize, block_bytes)
    step = _chunk(old.itemsize, per)
    size = seg.stop - seg.start
    cap = min(size, step + size // 32)
    idx, diff = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=old.dtype)
    k, counted = 0, -1  # counted >= 0 once past the limit
    base_blocks, target_blocks = [], []
    for b in range(seg.start, seg.stop, per):
        end = min(b + per, seg.stop)
        hb, hn = (xxhash.xxh3_64(), xxhash.xxh3_64()) if end - b > step else (None, None)
        for s in range(b, end, step):
            o, n = old[s : min(s + step, end)], new[s : min(s + step, end)]
            if counted < 0:
                if k + o.size > cap:
                    cap = min(size, max(2 * cap, k + o.size))
                    idx, diff = _grown(idx, k, cap), _grown(diff, k, cap)
                k = _scan(o, n, s, idx, diff, k)
                if k > limit:
                    counted, idx, diff = k, None, None
            else:
                counted += _count(o, n)
            if hb is None:  # the block is this one chunk, still in cache
                base_blocks.append(xxhash.xxh3_64_intdigest(o))
                target_blocks.append(xxhash.xxh3_64_intdigest(n))
            else:
                hb.update(o)
                hn.update(n)
        if hb is not None:
            base_blocks.append(hb.intdigest())
            target_blocks.append(hn.intdigest())
    if counted >= 0:
        return SegScan(None, None, counted, base_blocks, target_blocks)
    return SegScan(idx[:k], diff[:k], k, base_blocks, target_blocks)


def _grown(a: np.ndarray, used: int, cap: int) -> np.ndarray:
    out = np.empty(cap, dtype=a.dtype)
    out[:used] = a[:used]
    return out


def write_segment(
    bits: np.ndarray,
    idx: np.ndarray,
    diff: np.ndarray,
    old: np.ndarray,
    seg: Segment,
    block_bytes: int,
    src: np.ndarray | None = None,
    verify: bool = True,
) -> list[int]:
    """Add the differences of the changes inside `seg` (copying `src` into it first, chunk by chunk, when given),
    remembering the overwritten bits in `old` (same slots as idx), and hash each block as it is written.
    Returns the block digests (empty when not verifying)."""
    if src is None and not verify:  # nothing full-size to read: one call over the whole segment
        first, end = np.searchsorted(idx, [seg.start, seg.stop]).tolist()
        _write(bits, idx, diff, old, first, end)
        return []
    per = block_elems(bits.itemsize, block_bytes)
    step = _chunk(bits.itemsize, per)
    if _HAVE_XXH3 and verify and step == per and seg.start == 0 and seg.stop == bits.size:
        # The whole (segment) array, blocks hashed in one pass: one compiled call.
        digests = np.empty(-(-bits.size // per), dtype=np.uint64)
        _write_blocks(bits, idx, diff, old, per, bits if src is None else src, src is not None, digests)
        return digests.tolist()
    blocks = [(b, min(b + per, seg.stop)) for b in range(seg.start, seg.stop, per)]
    starts = [s for b, end in blocks for s in range(b, end, step)]
    ends = np.searchsorted(idx, [*starts, seg.stop]).tolist()  # the change slots of every chunk at once
    digests, c = [], 0
    for b, end in blocks:
        chunks = []
        for s in range(b, end, step):
            chunk = bits[s : min(s + step, end)]
            if src is not None:
                chunk[:] = src[s : s + chunk.size]
            _write(bits, idx, diff, old, ends[c], ends[c + 1])
            c += 1
            chunks.append(chunk)
        if verify:  # a block of one chunk is hashed right after it is written, while it is in cache
            digests.append(_digest(chunks))
    return digests


def restore(bits: np.ndarray, idx: np.ndarray, old: np.ndarray) -> None:
    """Undo writes exactly."""
    _restore(bits, idx, old)


# ---------------------------------------------------------------- byte planes


def max_gap(idx: np.ndarray, prev: int = -1) -> int:
    return int(_max_gap(idx, prev)) if idx.size else 0


def gap_planes_for(top_gap: int) -> int:
    """Gap planes needed for gaps up to `top_gap` (at least one)."""
    return max(1, (top_gap.bit_length() + 7) // 8)


def _eight(rows: list[np.ndarray]) -> list[np.ndarray]:
    """The planes as eight 1-D arrays for the kernels (the missing ones repeat the first; never touched)."""
    return rows + [rows[0]] * (8 - len(rows))


def fill_planes(idx: np.ndarray, diff: np.ndarray, prev: int, gap_planes: int, out: np.ndarray, col: int) -> None:
    """Write the planes of these changes into out[:, col : col + idx.size] (the first gap taken from `prev`)."""
    if idx.size:
        cols = [out[j, col : col + idx.size] for j in range(out.shape[0])]
        _fill_gaps(idx, prev, gap_planes, *_eight(cols[:gap_planes]))
        _fill_values(diff, diff.itemsize, *_eight(cols[gap_planes:]))


def byte_planes(idx: np.ndarray, diff: np.ndarray) -> tuple[np.ndarray, int]:
    """The raw byte planes [gap planes..., value planes...] x changes, and the number of gap planes."""
    gap_planes = gap_planes_for(max_gap(idx))
    out = np.empty((gap_planes + diff.itemsize, idx.size), dtype=np.uint8)
    fill_planes(idx, diff, -1, gap_planes, out, 0)
    return out, gap_planes


def read_positions(planes: Sequence[np.ndarray], gap_planes: int, numel: int) -> tuple[np.ndarray, bool]:
    """Positions from the gap planes (a 2-D array or a list of 1-D planes), and whether they all lie inside
    [0, numel)."""
    idx = np.empty(planes[0].size, dtype=np.int64)
    if not idx.size:
        return idx, True
    rows = _eight(list(planes[:gap_planes]))
    if idx.size > SAFE_SUM // max(numel, 1):  # a running sum of gaps < numel could pass 2**63: check each step
        _read_gaps(gap_planes, *rows, idx, False)
        return idx, _positions_checked(idx, numel) == 0
    top = int(_read_gaps(gap_planes, *rows, idx, True))
    return idx, top < numel and int(idx[-1]) < numel


def read_values(planes: Sequence[np.ndarray], gap_planes: int, dtype: np.dtype) -> tuple[np.ndarray, bool]:
    """Modular differences from the value planes, and whether none is zero."""
    diff = np.empty(planes[0].size, dtype=dtype)
    if not diff.size:
        return diff, True
    return diff, _read_values(diff.itemsize, *_eight(list(planes[gap_planes:])), diff) == 0


def read_planes(planes: np.ndarray, gap_planes: int, numel: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, int]:
    """Positions and differences from byte planes; the int is 0 when valid, 1 if a position runs past numel,
    2 if a difference is zero."""
    idx, in_range = read_positions(planes, gap_planes, numel)
    diff, nonzero = read_values(planes, gap_planes, dtype)
    return idx, diff, 0 if in_range and nonzero else (1 if not in_range else 2)


# ---------------------------------------------------------------- whole-array helpers (one thread)


class Scan(NamedTuple):
    """One pass over a base/new pair: changed positions and differences (None past the limit), count, checksums."""

    idx: np.ndarray | None
    diff: np.ndarray | None
    changed: int
    base_xxh3: int
    target_xxh3: int


def scan_pair(old: np.ndarray, new: np.ndarray, limit: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Scan:
    """scan_segment over a whole 1-D pair, with the tensor checksums (format.tensor_checksum) of both."""
    s = scan_segment(old, new, Segment(0, old.size), limit, block_bytes)
    nbytes = old.nbytes
    return Scan(
        s.idx,
        s.diff,
        s.changed,
        combine_digests(s.base_blocks, nbytes, block_bytes),
        combine_digests(s.target_blocks, nbytes, block_bytes),
    )


def changed_positions(old: np.ndarray, new: np.ndarray, limit: int | None = None) -> np.ndarray | None:
    """Sorted int64 positions where the bit patterns differ; None once more than `limit` are found."""
    found = scan_pair(old.reshape(-1), new.reshape(-1), old.size if limit is None else limit)
    return found.idx


def write_and_hash(
    bits: np.ndarray,
    idx: np.ndarray,
    diff: np.ndarray,
    src: np.ndarray | None = None,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> tuple[np.ndarray, int]:
    """write_segment over a whole array on one thread. Returns the overwritten bits and the tensor checksum."""
    old = np.empty_like(diff)
    digests = write_segment(bits, idx, diff, old, Segment(0, bits.size), block_bytes, src)
    return old, combine_digests(digests, bits.nbytes, block_bytes)


def write(bits: np.ndarray, idx: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """Add the differences at the positions, without hashing; returns the overwritten bits."""
    old = np.empty_like(diff)
    _write(bits, idx, diff, old, 0, idx.size)
    return old
