"""The torch-facing delta API: encode, apply and apply_ over `dict[str, torch.Tensor]`.

Tensors are viewed as raw bits (an unsigned integer view of their bytes) and handed to the numpy
codec; nothing is computed on their values. CPU-contiguous tensors are read and written without a
copy; others (GPU, strided) go through a CPU copy and are written back after validation.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import numpy as np
import torch

from rlboost.delta.codec import BitArray, apply_arrays, apply_arrays_, certainly_exceeds, encode_arrays, uint_dtype
from rlboost.delta.format import DEFAULT_BLOCK_BYTES, DTYPE_ITEMSIZE, Delta, DeltaError

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# torch dtype -> the codec's name, for the dtypes the codec carries (a dict lookup: str(dtype) costs more per tensor).
_DTYPE_NAME = {getattr(torch, n): n for n in DTYPE_ITEMSIZE if isinstance(getattr(torch, n, None), torch.dtype)}


def dtype_name(t: torch.Tensor) -> str:
    """The codec's name for a tensor's dtype ('bfloat16', 'float32', ...)."""
    return str(t.dtype).removeprefix("torch.")


def _cpu_flat(name: str, t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise DeltaError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPE_NAME:
        raise DeltaError(f"tensor {name!r}: unsupported dtype {dtype_name(t)}")
    return t.detach().cpu().contiguous().reshape(-1)


def _in_place(t: object) -> bool:
    """Whether the codec can read and write `t`'s memory directly (a CPU-contiguous tensor of a codec dtype)."""
    return isinstance(t, torch.Tensor) and t.is_cpu and t.dtype in _DTYPE_NAME and t.is_contiguous()


def to_bits(name: str, t: torch.Tensor) -> BitArray:
    """A BitArray sharing memory with `t` when it is CPU-contiguous (else with a CPU copy)."""
    flat = t.detach() if _in_place(t) else _cpu_flat(name, t)
    dtype = _DTYPE_NAME[t.dtype]
    ints = flat.view(_INT_VIEW[DTYPE_ITEMSIZE[dtype]]).numpy().view(uint_dtype(dtype)).reshape(-1)
    return BitArray(dtype, tuple(t.shape), ints)


def _bits_of(state: Mapping[str, torch.Tensor]) -> dict[str, BitArray]:
    return {name: to_bits(name, t) for name, t in state.items()}


def encode(
    base: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    *,
    base_version: int,
    version: int,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> bytes:
    """Delta bytes taking `base` (weights at `base_version`) to `new` (at `version`), bit-exactly. `block_bytes`:
    the hash block of the tensor checksums (a power of two, 4 KiB..1 GiB; deltas composed together must agree)."""
    bits_base, bits_new = _bits_of(base), _bits_of(new)
    return encode_arrays(bits_base, bits_new, base_version=base_version, version=version, block_bytes=block_bytes)


def exceeds(base: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], nbytes: float) -> bool:
    """Whether `encode(base, new)` is certain to be larger than `nbytes`, decided from a count of changed elements
    without encoding (the tensors with more than a quarter of their elements changed go whole). False when
    undecided: then only encoding tells. A caller that would drop a delta above `nbytes` can skip the encode."""
    try:
        return certainly_exceeds(_bits_of(base), _bits_of(new), nbytes)
    except DeltaError:  # an unsupported tensor: encode() names it
        return False


def apply(base: Mapping[str, torch.Tensor], delta: bytes) -> dict[str, torch.Tensor]:
    """New tensors (on the base tensors' devices) bit-identical to the delta's target; `base` is untouched."""
    out = apply_arrays(_bits_of(base), delta)
    return {name: _tensor_of(out[name], t).to(t.device) for name, t in base.items()}


def _tensor_of(a: BitArray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(a.bits.view(_np_int(like))).view(like.dtype).reshape(like.shape)


def apply_(base: Mapping[str, torch.Tensor], delta: bytes, *, verify_target: bool = True) -> Delta:
    """Apply a delta in place into `base`'s tensors. The whole delta is decoded and validated before the first
    write and every tensor hashed as it is written (`verify_target`; a mismatch means a wrong base or a forged
    delta and is rolled back exactly): on any DeltaError the tensors hold exactly their old bits. Returns the
    parsed delta (its table: e.g. the targets' checksums, without parsing it again)."""
    bits = _bits_of(base)
    parsed = apply_arrays_(bits, delta, verify_target=verify_target)
    with torch.no_grad():
        for name, t in base.items():
            if not _in_place(t):  # changed in a CPU copy: write it back
                t.copy_(_tensor_of(bits[name], t))
    return parsed


def _np_int(t: torch.Tensor) -> type[np.integer]:
    return {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[t.element_size()]


def warm_up(dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)) -> float:
    """Compile the codec's kernels (encode, and apply in place and into copies) for the element widths of `dtypes`
    and return the seconds it took. Published weights are bf16 (fp16 shares its kernels; fp32 has its own). The
    first call of each kernel in a process compiles it, ~10 s per width on a 2-core VM when numba's disk cache is
    empty (a new container), ~0.3 s from the cache: called in a background thread at start-up, the JIT runs beside
    loading instead of in a worker's first sync or a trainer's first publish. Thread-safe."""
    start = time.monotonic()
    for dtype in dtypes:
        base = {"w": torch.zeros(8192, dtype=dtype)}
        new = {"w": base["w"].clone()}
        new["w"][::7] = 1
        blob = encode(base, new, base_version=0, version=1)
        exceeds(base, new, 0)  # the changed-element count
        apply_({"w": base["w"].clone()}, bytearray(blob))  # pulled payloads are bytearrays, stored ones bytes
        apply(base, blob)
    return time.monotonic() - start


def warm_up_in_background(dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)) -> threading.Thread:
    """warm_up(dtypes) in a daemon thread that logs when the kernels are ready; returns the (started) thread."""

    def run() -> None:
        seconds = warm_up(dtypes)
        logging.getLogger("rlboost.delta").info("delta codec kernels ready", extra={"seconds": round(seconds, 2)})

    thread = threading.Thread(target=run, name="rlboost-delta-warm-up", daemon=True)
    thread.start()
    return thread
