"""ZeRO-3 publication without gathering the model: each rank extracts the bf16 delta of its own partition.

Under ZeRO-3 rank r of W holds, for every parameter p, `p.ds_tensor`: the flat slice
[r * s, (r + 1) * s) of p (s = ceil(numel / W), the tail past numel is padding and is ignored). Each rank
keeps the bf16 bits it last extracted for its slices; after a step it casts its fp32 slices to bf16 exactly
as the publisher does (`rlboost.weights.safetensors_io.to_publish_dtype`), finds the positions whose bits
changed (the delta codec's vector scan, `rlboost.delta._scan.changed_positions`) and sends rank 0 only
those positions and their new bits, or the whole slice when more than a third changed (4 + 2 bytes per
change against 2 per element). Rank 0 writes them into its copy of the last extracted full bf16 state;
the result is the state the gathered path (gather fp32 params, cast) gives, bit for bit, since the cast is
elementwise. The first extraction sends every slice whole.

Rank 0 never mutates a tensor it has returned (copy-on-write per changed tensor): the publisher may still
hold the previous state as its delta base. Tied parameters (one Parameter under two names) are extracted
once and copied to the second name, as `PolicyEngine.full_state` does. Tensors without a partition
(buffers) are read on rank 0 directly.

Every rank must call `extract()` in the same order (it runs a gather collective on the default group).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from prometheus_client import Counter, Gauge

from rlboost.weights.safetensors_io import to_publish_dtype

log = logging.getLogger(__name__)

EXTRACTION_BYTES = Gauge(
    "rlboost_trainer_extraction_last_bytes",
    "Bytes moved to rank 0 to extract the last published state (partitioned: deltas; gathered: parameters)",
    ["path"],
)
EXTRACTION_BYTES_TOTAL = Counter(
    "rlboost_trainer_extraction_bytes_total", "Bytes moved to rank 0 for state extraction, all steps", ["path"]
)

# A slice is sent whole when more than this fraction of it changed: a change costs 4 (position) + 2 (bits)
# bytes, a whole bf16 element 2.
SPARSE_MAX_FRACTION = 1 / 3

_UINT = {
    1: (torch.uint8, np.uint8),
    2: (torch.int16, np.uint16),
    4: (torch.int32, np.uint32),
    8: (torch.int64, np.uint64),
}


@dataclass
class Extraction:
    """One extraction's traffic: what moved to rank 0 and how."""

    bytes_to_rank0: int  # array payload bytes from the other ranks (rank 0's own slices do not move)
    sparse_slices: int  # slices sent as positions + bits, over all ranks
    whole_slices: int  # slices sent whole (first extraction, or most of it changed)
    changed: int  # changed elements over all ranks (whole slices count every element)


def unsupported_reason(module: torch.nn.Module, world: int) -> str | None:
    """Why the partitioned path cannot run on this module (None when it can): the gathered path is used then."""
    import torch.distributed as dist

    parts = [t for t in module.state_dict(keep_vars=True).values() if hasattr(t, "ds_id")]
    if not parts:
        return "no ZeRO-3 partitioned parameters"
    for p in parts:
        ds = getattr(p, "ds_tensor", None)
        if ds is None:
            return f"parameter {p.ds_id} has no local partition"
        if str(getattr(ds, "final_location", None)).endswith("nvme"):
            return "parameters are offloaded to NVMe"
        group = getattr(p, "ds_process_group", None)
        if dist.is_initialized() and dist.get_world_size(group=group) != world:
            return "parameters are partitioned over a subgroup (MiCS / hpZ), not the whole world"
    return None


def _partition_size(p: Any) -> int:
    """Elements per rank of a ZeRO-3 parameter: ceil(numel / world), padding included."""
    return int(getattr(p.ds_tensor, "ds_numel", p.ds_tensor.numel()))


def _bits(t: torch.Tensor) -> np.ndarray:
    """The raw bits of a CPU tensor as a 1-D unsigned numpy array (a view)."""
    as_torch, as_numpy = _UINT[t.element_size()]
    return t.contiguous().reshape(-1).view(as_torch).numpy().view(as_numpy)


class PartitionDeltaExtractor:
    """The published (bf16) state of a ZeRO-3 module, assembled on rank 0 from per-rank partition deltas."""

    def __init__(self, module: torch.nn.Module, rank: int, world: int) -> None:
        self.module, self.rank, self.world = module, rank, world
        self._prev: dict[str, np.ndarray] = {}  # this rank's last extracted slice bits, per parameter name
        self._state: dict[str, torch.Tensor] = {}  # rank 0: the last extracted full state

    # ---- every rank -------------------------------------------------------------------------------
    def _params(self) -> tuple[list[tuple[str, Any]], dict[str, str], list[tuple[str, torch.Tensor]]]:
        """(partitioned params, tied name -> first name, unpartitioned tensors), in state_dict order."""
        first: dict[int, str] = {}
        parts, tied, plain = [], {}, []
        for name, t in self.module.state_dict(keep_vars=True).items():
            if id(t) in first:
                tied[name] = first[id(t)]
                continue
            first[id(t)] = name
            (parts if hasattr(t, "ds_id") else plain).append((name, t))
        return parts, tied, plain

    def _slice(self, p: Any) -> torch.Tensor:
        """The valid part of this rank's partition of `p`, cast to the publish dtype, on CPU."""
        size = _partition_size(p)
        valid = max(0, min(size, p.ds_numel - self.rank * size))  # the last partitions' tail past numel is padding
        part = p.ds_tensor.detach().reshape(-1).narrow(0, 0, valid).cpu()
        return to_publish_dtype({"p": part})["p"]

    def _local_delta(self, parts: list[tuple[str, Any]]) -> dict[str, tuple]:
        """name -> ('whole', bits) or ('sparse', positions, bits) for this rank's slices; updates _prev."""
        from rlboost.delta._scan import changed_positions

        out: dict[str, tuple] = {}
        for name, p in parts:
            new = _bits(self._slice(p))
            prev = self._prev.get(name)
            idx = None
            if prev is not None and prev.shape == new.shape:
                idx = changed_positions(prev, new, limit=int(new.size * SPARSE_MAX_FRACTION))
            if idx is None:
                self._prev[name] = new.copy()  # `new` may alias a bf16 ds_tensor that the optimizer updates
                out[name] = ("whole", self._prev[name])
            elif idx.size:
                vals = new[idx]
                prev[idx] = vals
                pos = idx.astype(np.int32) if new.size < 2**31 else idx
                out[name] = ("sparse", pos, vals)
        return out

    def extract(self) -> tuple[dict[str, torch.Tensor], Extraction]:
        """Rank 0: the new full published state (HF names, CPU); other ranks: {}. Every rank must call it."""
        parts, tied, plain = self._params()
        mine = self._local_delta(parts)
        gathered = self._gather(mine)
        if self.rank != 0:
            return {}, Extraction(0, 0, 0, 0)
        stats = _traffic(gathered)
        return self._assemble(parts, tied, plain, gathered), stats

    def _gather(self, mine: dict[str, tuple]) -> list[dict[str, tuple]]:
        if self.world == 1:
            return [mine]
        import torch.distributed as dist

        box: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, box, dst=0)
        return box if box is not None else []

    # ---- rank 0 -----------------------------------------------------------------------------------
    def _assemble(
        self,
        parts: list[tuple[str, Any]],
        tied: dict[str, str],
        plain: list[tuple[str, torch.Tensor]],
        gathered: list[dict[str, tuple]],
    ) -> dict[str, torch.Tensor]:
        state = dict(self._state)
        changed: set[str] = set()
        for name, p in parts:
            msgs = [(r, g[name]) for r, g in enumerate(gathered) if name in g]
            if not msgs:
                continue
            held = state.get(name)
            if held is None:
                dtype = to_publish_dtype({"p": torch.empty(0, dtype=p.dtype)})["p"].dtype
                held = torch.empty(p.ds_shape, dtype=dtype)
            else:
                held = held.clone()  # copy-on-write: the returned previous state must not move
            flat = _bits(held)  # a view: writing it writes `held`
            size = _partition_size(p)
            for r, msg in msgs:
                start = r * size
                if msg[0] == "whole":
                    flat[start : start + msg[1].size] = msg[1]
                else:
                    flat[start + msg[1].astype(np.int64)] = msg[2]
            state[name] = held
            changed.add(name)
        for name, t in plain:
            cast = to_publish_dtype({"p": t.detach().cpu()})["p"]
            if name not in state or not torch.equal(_as_bits(state[name]), _as_bits(cast)):
                state[name] = cast.clone()
        for name, src in tied.items():
            if name not in state or src in changed:
                state[name] = state[src].clone()  # separate storage, as safetensors wants
        self._state = state
        return dict(state)


def _as_bits(t: torch.Tensor) -> torch.Tensor:
    """Compare bit patterns, not values (NaN, -0.0)."""
    return t.contiguous().view(_UINT[t.element_size()][0]) if t.is_floating_point() else t


def _traffic(gathered: list[dict[str, tuple]]) -> Extraction:
    moved = sparse = whole = changed = 0
    for r, msgs in enumerate(gathered):
        for msg in msgs.values():
            arrays = msg[1:]
            if r != 0:
                moved += sum(a.nbytes for a in arrays)
            if msg[0] == "whole":
                whole += 1
                changed += msg[1].size
            else:
                sparse += 1
                changed += msg[1].size
    return Extraction(moved, sparse, whole, changed)
