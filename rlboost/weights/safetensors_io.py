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
    """Parse safetensors bytes into a state dict of CPU tensors; ValueError on a malformed payload."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except SafetensorError as err:
        raise ValueError(f"not a valid safetensors payload: {err}") from None


def to_publish_dtype(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Floating tensors cast to `dtype` (default bf16); tensors already in it keep their exact bits; others untouched."""
    import torch

    dtype = dtype or torch.bfloat16
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        t = t.detach()
        out[name] = t.to(dtype) if t.is_floating_point() and t.dtype != dtype else t
    return out
