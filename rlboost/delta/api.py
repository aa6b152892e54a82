"""The torch-facing delta API: encode, apply and apply_ over `dict[str, torch.Tensor]`.

Tensors are viewed as raw bits (an unsigned integer view of their bytes) and handed to the numpy
codec; nothing is computed on their values. CPU-contiguous tensors are read and written without a
copy; others (GPU, strided) go through a CPU copy and are written back after validation.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rlboost.delta.codec import BitArray, apply_arrays, apply_arrays_, encode_arrays, uint_dtype
from rlboost.delta.format import DEFAULT_BLOCK_BYTES, DTYPE_ITEMSIZE, Delta, DeltaError

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def dtype_name(t: torch.Tensor) -> str:
    """The codec's name for a tensor's dtype ('bfloat16', 'float32', ...)."""
    return str(t.dtype).removeprefix("torch.")


def _cpu_flat(name: str, t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise DeltaError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
    dtype = dtype_name(t)
    if dtype not in DTYPE_ITEMSIZE:
        raise DeltaError(f"tensor {name!r}: unsupported dtype {dtype}")
    return t.detach().cpu().contiguous().reshape(-1)


def to_bits(name: str, t: torch.Tensor) -> BitArray:
    """A BitArray sharing memory with `t` when it is CPU-contiguous (else with a CPU copy)."""
    flat = _cpu_flat(name, t)
    dtype = dtype_name(t)
    ints = flat.view(_INT_VIEW[DTYPE_ITEMSIZE[dtype]]).numpy().view(uint_dtype(dtype))
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
            if not _shares_memory(t, bits[name]):
                t.copy_(_tensor_of(bits[name], t))
    return parsed


def _shares_memory(t: torch.Tensor, a: BitArray) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0 and t.data_ptr() == a.bits.ctypes.data


def _np_int(t: torch.Tensor) -> type[np.integer]:
    return {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[t.element_size()]
