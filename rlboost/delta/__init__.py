"""Sparse, bit-exact weight deltas: encode a->b, apply it, inspect it, compose a->b->c into a->c.

    import rlboost.delta as rd
    blob = rd.encode(base, new, base_version=3, version=4)   # dict[str, torch.Tensor] -> bytes
    out = rd.apply(base, blob)                               # new tensors, bit-identical to `new`
    rd.apply_(base, blob)                                    # in place; validated before any write
    rd.exceeds(base, new, nbytes)                            # encode() certainly larger than nbytes? (a count)
    rd.inspect(blob).changed_fraction                        # DeltaInfo, per tensor too
    rd.compose(blob_ab, blob_bc)                             # a->c without the weights
    rd.tensor_checksum(raw_bytes)                            # the format's (block-wise xxh3) tensor checksum
    rd.warm_up_in_background()                               # compile the kernels now, beside start-up

`encode`, `apply`, `apply_` and the warm-ups need torch and are loaded on first use (PEP 562), so
`import rlboost.delta` stays torch-free for the weight-server. Torch-free code that wants
import-linter to see no path to torch imports `rlboost.delta.compact` / `.format` / `.codec`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlboost.delta.compact import compose, compose_chain
from rlboost.delta.format import FORMAT_VERSION, DeltaError, DeltaInfo, TensorInfo, inspect, tensor_checksum

if TYPE_CHECKING:
    from rlboost.delta.api import apply, apply_, encode, exceeds, warm_up, warm_up_in_background

__all__ = [
    "FORMAT_VERSION",
    "DeltaError",
    "DeltaInfo",
    "TensorInfo",
    "apply",
    "apply_",
    "compose",
    "compose_chain",
    "encode",
    "exceeds",
    "inspect",
    "tensor_checksum",
    "warm_up",
    "warm_up_in_background",
]

_TORCH_API = {"encode", "exceeds", "apply", "apply_", "warm_up", "warm_up_in_background"}


def __getattr__(name: str) -> Any:
    if name in _TORCH_API:
        # Loaded by name on first use: torch is imported only by code that calls the torch API,
        # never by importing this package (the weight-server imports it for compose/inspect).
        return getattr(importlib.import_module("rlboost.delta.api"), name)
    raise AttributeError(f"module 'rlboost.delta' has no attribute {name!r}")
