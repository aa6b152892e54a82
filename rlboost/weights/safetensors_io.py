"""Parameter states as safetensors bytes, and the bf16 form weights are published in (torch imported lazily)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def state_to_bytes(state: Mapping[str, torch.Tensor]) -> bytes:
    """Serialise a state dict to safetensors bytes (tensors made contiguous, on CPU)."""
    from safetensors.torch import save

    return save({name: t.detach().contiguous().cpu() for name, t in state.items()})


def state_from_bytes(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into a state dict of CPU tensors; ValueError on a malformed payload.

    A bytearray (what the weights client returns) is not copied: the tensors are views of it, so a pulled
    snapshot costs its size in memory once, not three times (buffer, bytes copy, tensors: 48 GB for an 8B
    model on a spot VM that may have 32). Other inputs go through safetensors' own loader (a copy)."""
    if isinstance(data, bytearray):
        return _views_of(data)
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except SafetensorError as err:
        raise ValueError(f"not a valid safetensors payload: {err}") from None


_DTYPES = {  # safetensors dtype names -> torch dtype names
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


def _views_of(buf: bytearray) -> dict[str, torch.Tensor]:
    """Tensors over `buf` without a copy, after the checks safetensors makes: a bounded JSON header, known
    dtypes, shapes matching byte lengths, offsets inside the data and tiling it exactly (no gap, no overlap)."""
    import torch

    entries, start = _header(buf)
    out, end = {}, 0
    for name, (dtype, shape, (b, e)) in sorted(entries.items(), key=lambda kv: kv[1][2]):
        if b != end:
            raise ValueError(f"not a valid safetensors payload: tensor {name!r} starts at {b}, expected {end}")
        if start + e > len(buf):
            raise ValueError(
                f"not a valid safetensors payload: tensor {name!r} ends past the {len(buf) - start} data bytes"
            )
        end = e
        dt = getattr(torch, _DTYPES[dtype])
        numel = e - b and (e - b) // dt.itemsize
        if (start + b) % dt.itemsize or not numel:  # misaligned (a foreign writer) or empty: a copy
            raw = torch.frombuffer(buf, dtype=torch.uint8, count=e - b, offset=start + b) if numel else None
            out[name] = raw.clone().view(dt).reshape(shape) if raw is not None else torch.empty(shape, dtype=dt)
        else:
            out[name] = torch.frombuffer(buf, dtype=dt, count=numel, offset=start + b).reshape(shape)
    if start + end != len(buf):
        raise ValueError(f"not a valid safetensors payload: tensors cover {end} of {len(buf) - start} data bytes")
    return out


def _header(buf: bytearray) -> tuple[dict[str, tuple[str, list[int], tuple[int, int]]], int]:
    """The validated entries {name: (dtype, shape, (begin, end))} and where the data starts."""
    import json
    import math
    import struct

    import torch

    bad = "not a valid safetensors payload"
    if len(buf) < 8:
        raise ValueError(f"{bad}: {len(buf)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n > min(_MAX_HEADER, len(buf) - 8):
        raise ValueError(f"{bad}: header length {n} does not fit the {len(buf)}-byte payload")
    try:
        doc = json.loads(bytes(buf[8 : 8 + n]))
    except ValueError as err:
        raise ValueError(f"{bad}: header is not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{bad}: header is not a JSON object")
    entries = {}
    for name, info in doc.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
            ints = [*shape, b, e] if isinstance(shape, list) else [None]
            ok = dtype in _DTYPES and all(type(x) is int and x >= 0 for x in ints)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok or not 0 <= b <= e:
            raise ValueError(f"{bad}: tensor {name!r} has a malformed entry {info!r}")
        if e - b != math.prod(shape) * getattr(torch, _DTYPES[dtype]).itemsize:
            raise ValueError(f"{bad}: tensor {name!r}: {e - b} bytes for shape {shape} of {dtype}")
        entries[name] = (dtype, shape, (b, e))
    return entries, 8 + n


def to_publish_dtype(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Floating tensors cast to `dtype` (default bf16); tensors already in it keep their exact bits; others untouched."""
    import torch

    dtype = dtype or torch.bfloat16
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach()
        out[name] = t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
    return out
