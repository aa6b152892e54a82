"""Compose deltas without the weights: a->b plus b->c gives a->c (torch-free, for the weight-server).

Sparse entries store modular differences of bit patterns, and those add: (c-b)+(b-a) = c-a
modulo 2**bits. So a composed sparse entry is the union of both position sets with the
differences summed there, dropping positions whose sum is 0 (changed and changed back).
Dense entries carry new bytes: a dense b->c wins outright; a dense a->b followed by a sparse b->c
gives a dense a->c (b's bytes with the b->c differences added). Without the weights a composed
tensor cannot fall back to dense when its sparse form grows past the tensor's size; it stays sparse
(still exact), and `changed` of a composed dense entry is an upper bound.

Chain links are checked by checksum: every tensor's base checksum in b->c must equal its target
checksum in a->b, so a broken chain is rejected rather than silently composed. Both deltas must hash
with the same block size (format.tensor_checksum), else their checksums cannot be compared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rlboost.delta.codec import Staged, decode_entry, encode_sparse, must_split
from rlboost.delta.format import Delta, DeltaError, TensorEntry, pack, parse, tensor_checksum


def compose(d_ab: bytes | memoryview, d_bc: bytes | memoryview) -> bytes:
    """The delta a->c equivalent to applying `d_ab` then `d_bc`. Raises DeltaError on a broken chain."""
    ab, bc = parse(d_ab), parse(d_bc)
    if ab.header.version != bc.header.base_version:
        raise DeltaError(
            f"cannot compose: first delta produces version {ab.header.version}, "
            f"second applies to version {bc.header.base_version}"
        )
    if ab.block_bytes != bc.block_bytes:
        raise DeltaError(
            f"cannot compose: the deltas hash tensors in blocks of {ab.block_bytes} and {bc.block_bytes} bytes; "
            "re-encode one of them with the other's hash_block_bytes"
        )
    first = {e.name: e for e in ab.tensors}
    if set(first) != {e.name for e in bc.tensors}:
        raise DeltaError("cannot compose: the two deltas cover different tensor names")
    entries, parts, offset = [], [], 0
    total = sum(e.nbytes for e in bc.tensors)
    for eb in bc.tensors:
        entry, payload = _compose_tensor(ab, first[eb.name], bc, eb, must_split(eb.nbytes, total))
        entries.append(entry.model_copy(update={"offset": offset, "length": len(payload)}))
        parts.append(payload)
        offset += len(payload)
    return pack(ab.header.base_version, bc.header.version, entries, parts, ab.block_bytes)


def compose_chain(deltas: Sequence[bytes | memoryview]) -> bytes:
    """Fold a chain v0->v1, v1->v2, ... into one delta v0->vn."""
    if not deltas:
        raise DeltaError("cannot compose an empty chain of deltas")
    out = bytes(deltas[0])
    for d in deltas[1:]:
        out = compose(out, d)
    return out


def _compose_tensor(ab: Delta, ea: TensorEntry, bc: Delta, eb: TensorEntry, split: bool) -> tuple[TensorEntry, bytes]:
    """One tensor of a->c; `split`: whether its sparse form is cut in two segments or more for the apply's threads
    (only a tensor that is a large share of the state is, as in encode)."""
    where = f"tensor {eb.name!r}"
    if (ea.dtype, ea.shape) != (eb.dtype, eb.shape):
        raise DeltaError(f"cannot compose {where}: {ea.dtype}{ea.shape} then {eb.dtype}{eb.shape}")
    if eb.base_xxh3 != ea.target_xxh3:
        raise DeltaError(f"cannot compose {where}: second delta's base is not the first delta's target")
    sa, sb = decode_entry(ab, ea), decode_entry(bc, eb)
    ends = {"base_xxh3": ea.base_xxh3, "target_xxh3": eb.target_xxh3}
    if eb.encoding == "unchanged":
        return ea.model_copy(update=ends), bytes(ab.payload_of(ea))
    if ea.encoding == "unchanged":
        return eb.model_copy(update=ends), bytes(bc.payload_of(eb))
    if eb.encoding == "dense":
        return _dense(eb, ends, ea.changed + eb.changed, bytes(bc.payload_of(eb)), bc.block_bytes)
    if ea.encoding == "dense":
        values = sa.values.copy()
        values[sb.idx] += sb.values  # modular add on the bit patterns
        return _dense(eb, ends, ea.changed + eb.changed, values.tobytes(), bc.block_bytes)
    return _sparse_sum(eb, ends, sa, sb, bc.block_bytes, split)


def _dense(
    like: TensorEntry, ends: dict[str, int], changed_bound: int, payload: bytes, block_bytes: int
) -> tuple[TensorEntry, bytes]:
    entry = like.model_copy(
        update={
            **ends,
            "encoding": "dense",
            "changed": min(like.numel, changed_bound),
            "payload_xxh3": tensor_checksum(payload, block_bytes),
            "segments": [],
        }
    )
    return entry, payload


def _sparse_sum(
    like: TensorEntry, ends: dict[str, int], sa: Staged, sb: Staged, block_bytes: int, split: bool
) -> tuple[TensorEntry, bytes]:
    idx = np.concatenate([sa.idx, sb.idx])
    diff = np.concatenate([sa.values, sb.values])
    order = np.argsort(idx, kind="stable")
    idx, diff = idx[order], diff[order]
    uniq, starts = np.unique(idx, return_index=True)
    summed = np.add.reduceat(diff, starts, dtype=diff.dtype)  # wraps at the element width
    keep = summed != 0
    uniq, summed = uniq[keep], summed[keep]
    if uniq.size == 0:
        empty = tensor_checksum(b"", block_bytes)
        base = {"encoding": "unchanged", "changed": 0, "payload_xxh3": empty, "segments": []}
        return like.model_copy(update={**ends, **base, "target_xxh3": ends["base_xxh3"]}), b""
    segments, payload = encode_sparse(uniq, summed, like.numel, like.itemsize, block_bytes, split)
    update = {
        **ends,
        "encoding": "sparse",
        "changed": int(uniq.size),
        "payload_xxh3": tensor_checksum(payload, block_bytes),
        "segments": segments,
    }
    return like.model_copy(update=update), payload
