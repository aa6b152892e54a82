"""One compiled call per segment of an apply: decompress its planes, decode and check them, write, hash.

codec._run_job hands every segment of a delta to this kernel when it can: the zstd frames are decompressed by
libzstd called from compiled code (the zstandard package's own copy, exported by its cffi module and registered
with LLVM by symbol name, as _scan does with xxhash's XXH3_64bits), so a segment's whole job runs without the
GIL and costs one dispatch. The Python path (codec.decode_span, then _scan.write_segment) made ~8 calls per
segment, each taking the GIL back: on a model's ~90 segments that was ~3 ms of a ~20 ms apply, and the other
thread waited for the GIL meanwhile (docs/benchmarks.md, "Compiled segment jobs").

The kernel only reports what went wrong, as a status: the caller decodes such a segment again on the Python
path, which raises the DeltaError that names the fault. Without the exported symbols (another zstandard build)
`AVAILABLE` is False and the codec keeps the Python path; results are identical either way (tested).
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading

import numba
import numpy as np
import zstandard
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from rlboost.delta import _scan

OK, CORRUPT_STREAM, POSITION_OUT_OF_RANGE, ZERO_DIFFERENCE = 0, 1, 2, 3
_SYMBOLS = ("ZSTD_decompressDCtx", "ZSTD_getFrameContentSize", "ZSTD_isError")
_LOCAL = threading.local()


def _libzstd() -> ctypes.CDLL | None:
    """The zstandard package's cffi module, which exports libzstd's API (its C extension does not)."""
    for path in glob.glob(os.path.join(os.path.dirname(zstandard.__file__), "_cffi*.so")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if all(hasattr(lib, name) for name in (*_SYMBOLS, "ZSTD_createDCtx")):
            return lib
    return None


def _export() -> ctypes.CDLL | None:
    lib = _libzstd()
    if lib is None:
        return None
    for name in _SYMBOLS:
        binding.add_symbol(f"rlboost_{name}", ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
    lib.ZSTD_createDCtx.restype = ctypes.c_void_p
    return lib


_LIB = _export()
AVAILABLE = _LIB is not None and _scan._HAVE_XXH3


def dctx() -> int:
    """This thread's zstd decompression context (an address; contexts are not thread-safe; kept for the thread's
    life, as creating one per call costs ~0.2 ms of table set-up)."""
    if not hasattr(_LOCAL, "dctx"):
        assert _LIB is not None
        _LOCAL.dctx = _LIB.ZSTD_createDCtx()
    return _LOCAL.dctx


def _byte_ptr(context, builder, arrty, arr, offset):  # pragma: no cover - compiled
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [offset]), ir.IntType(8).as_pointer())


@intrinsic
def _frame_size(typingctx, src, offset, length):  # pragma: no cover - compiled
    """The content size a zstd frame at src[offset : offset + length] declares (ZSTD_getFrameContentSize: huge
    values for 'unknown' and 'error', which never equal a plane's size)."""
    sig = types.uint64(src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        arr, off, n = args
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(i64, [ir.IntType(8).as_pointer(), i64]),
            "rlboost_ZSTD_getFrameContentSize",
        )
        return builder.call(fn, [_byte_ptr(context, builder, signature.args[0], arr, off), n])

    return sig, codegen


@intrinsic
def _decompress(typingctx, ctx, dst, src, offset, length):  # pragma: no cover - compiled
    """Decompress the frame at src[offset : offset + length] into all of dst (1-D uint8) with the context at
    address `ctx`; the decompressed size, or -1 on a zstd error."""
    sig = types.int64(types.intp, dst, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        c, out, arr, off, n = args
        i8p, i64, i32 = ir.IntType(8).as_pointer(), ir.IntType(64), ir.IntType(32)
        dec = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i8p, i8p, i64, i8p, i64]), "rlboost_ZSTD_decompressDCtx"
        )
        is_error = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i64]), "rlboost_ZSTD_isError")
        dst_arr = context.make_array(signature.args[1])(context, builder, out)
        dst_ptr = builder.bitcast(dst_arr.data, i8p)
        src_ptr = _byte_ptr(context, builder, signature.args[2], arr, off)
        got = builder.call(dec, [builder.inttoptr(c, i8p), dst_ptr, dst_arr.nitems, src_ptr, n])
        failed = builder.icmp_unsigned("!=", builder.call(is_error, [got]), ir.Constant(i32, 0))
        return builder.select(failed, ir.Constant(i64, -1), got)

    return sig, codegen


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _planes(ctx, payload, offset, streams, changed):  # pragma: no cover - compiled
    """The segment's byte planes (one row each), or an empty array when a stream is corrupt: a stream as long as
    its plane is the raw plane, any other is one zstd frame that must declare and yield exactly `changed` bytes."""
    planes = np.empty((max(streams.size, 1), changed), np.uint8)
    for i in range(streams.size):
        n = streams[i]
        if n == changed:
            planes[i, :] = payload[offset : offset + n]
        elif _frame_size(payload, offset, n) != np.uint64(changed) or _decompress(
            ctx, planes[i], payload, offset, n
        ) != np.int64(changed):
            return np.empty((0, 0), np.uint8)
        offset += n
    return planes


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _positions(planes, gap_planes, numel, idx, checked):  # pragma: no cover - compiled
    """Positions into idx from the gap planes; whether they all lie inside [0, numel). `checked` sums with a
    check per step (when a running sum of gaps could pass 2**63, see _scan.read_positions)."""
    r = planes.shape[0] - 1
    g = [planes[min(j, r)] for j in range(8)]  # planes past gap_planes are never read
    if checked:
        _scan._read_gaps(gap_planes, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], idx, False)
        return _scan._positions_checked(idx, numel) == 0
    top = _scan._read_gaps(gap_planes, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], idx, True)
    return top < np.uint64(numel) and idx[idx.size - 1] < numel


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _differences(planes, gap_planes, diff):  # pragma: no cover - compiled
    """Modular differences into diff from the value planes; whether none is zero."""
    r = planes.shape[0] - 1
    v = [planes[min(gap_planes + j, r)] for j in range(8)]
    return _scan._read_values(diff.itemsize, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], diff) == 0


@numba.njit(nogil=True, cache=True, boundscheck=False)
def apply_segment(ctx, payload, offset, streams, changed, gap_planes, bits, src, copy, per, verify, checked):  # noqa: PLR0913 # pragma: no cover - compiled
    """Decode a segment's changes (payload[offset:] holds its streams) and only then write them into `bits` (the
    segment's elements; `src` copied in first when `copy`), hashing each block of `per` elements right after it is
    written when `verify`. Returns (status, positions, overwritten bits, block digests); a status other than OK
    means nothing was written."""
    idx = np.empty(changed, np.int64)
    diff = np.empty(changed, bits.dtype)
    old = np.empty(changed, bits.dtype)
    digests = np.empty((bits.size + per - 1) // per if verify else 0, np.uint64)
    if changed:
        planes = _planes(ctx, payload, offset, streams, changed)
        if planes.shape[0] == 0:
            return CORRUPT_STREAM, idx, old, digests
        if not _positions(planes, gap_planes, bits.size, idx, checked):
            return POSITION_OUT_OF_RANGE, idx, old, digests
        if not _differences(planes, gap_planes, diff):
            return ZERO_DIFFERENCE, idx, old, digests
    if verify:
        _scan._write_blocks(bits, idx, diff, old, per, src, copy, digests)
    else:
        if copy:
            bits[:] = src
        _scan._write(bits, idx, diff, old, 0, changed)
    return OK, idx, old, digests
