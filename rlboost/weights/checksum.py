"""Checksum of a whole parameter state in canonical order.

sha256 over, for each tensor sorted by name: name, dtype, shape and its raw little-endian bytes.
Bit-level: two states match only if every bit pattern matches (NaN payloads, ±0 included).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (contiguous, CPU), without arithmetic on its values."""
    import torch

    flat = t.detach().contiguous().cpu().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """Hex sha256 of the whole state in canonical (sorted-name) order."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}\n".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
