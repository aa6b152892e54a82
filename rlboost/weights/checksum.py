"""Checksum of a whole parameter state: what a worker compares with the manifest after every pull.

Definition (format 2 of the state checksum): the hex sha256 of the canonical listing, one line per tensor in
sorted-name order,

    f"{name}|{dtype}|{shape}|{tensor_xxh3:016x}\\n"

where dtype is torch's name without "torch." ('bfloat16'), shape is `tuple(t.shape)` as Python prints it and
tensor_xxh3 is `rlboost.delta.format.tensor_checksum(raw bytes, DEFAULT_BLOCK_BYTES)`: the xxh3-64 of the raw
little-endian bytes when they fit in one 1 MiB block, else the xxh3-64 of the blocks' xxh3-64 digests.

Bit-level: only raw bytes are hashed, never values, so two states match only if every bit pattern matches
(NaN payloads and ±0 included). Cost: the blocks of all tensors are hashed on two threads (xxhash releases
the GIL), ~memory speed, where the former definition (sha256 of every byte) ran at ~1 GB/s on one thread.
And since the delta format checks every tensor against the same per-tensor checksum, the state checksum
after a verified `rlboost.delta.apply_` comes from the delta's table without reading the state again
(`delta_state_checksum`).

What it guards against: corruption (memory, disk, transfer) and a wrong base (a delta applied to weights that
are not its base version). Not against a malicious weight-server: xxh3-64 is not collision-resistant, so
anyone who can forge payloads can forge matching tensors; TLS and the weight-server's auth token do that job.
The sha256 over the listing only binds names, dtypes, shapes and the per-tensor digests together.

Checkpoints written by rlboost before this definition hold a sha256-of-bytes checksum that never equals this
one (the trainer says so on resume).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from rlboost.delta.format import DEFAULT_BLOCK_BYTES, block_digests, combine_digests

if TYPE_CHECKING:
    import torch

    from rlboost.delta.format import Delta

THREADS = 2  # hashing is memory-bound: two threads reach memory speed on the machines rlboost runs on
_PARALLEL_MIN_BYTES = 4 * DEFAULT_BLOCK_BYTES  # below this a thread hand-off costs more than it saves
_pools: dict[int, ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


class ListingEntry(NamedTuple):
    """One line of the canonical listing: a tensor's identity and its tensor_checksum."""

    name: str
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16" (the delta format uses the same names)
    shape: tuple[int, ...]
    xxh3: int  # rlboost.delta.format.tensor_checksum of the raw bytes, DEFAULT_BLOCK_BYTES blocks


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (contiguous, CPU), without arithmetic on its values."""
    import torch

    flat = t.detach().contiguous().cpu().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def dtype_name(t: torch.Tensor) -> str:
    """'bfloat16' for torch.bfloat16: the name the listing and the delta format both use."""
    return str(t.dtype).removeprefix("torch.")


def checksum_of_listing(entries: Iterable[tuple[str, str, Sequence[int], int]]) -> str:
    """Hex sha256 of the canonical listing of (name, dtype, shape, tensor_xxh3) entries, in any order."""
    h = hashlib.sha256()
    for name, dtype, shape, xxh3 in sorted(entries, key=lambda e: e[0]):
        h.update(f"{name}|{dtype}|{tuple(shape)}|{xxh3:016x}\n".encode())
    return h.hexdigest()


def state_checksum(state: Mapping[str, torch.Tensor], threads: int = THREADS) -> str:
    """Hex sha256 of the state's canonical listing (module docstring); blocks hashed on `threads` threads."""
    names = sorted(state)
    bufs = [tensor_bytes(state[n]) for n in names]
    digests = tensor_checksums(bufs, threads)
    return checksum_of_listing(
        ListingEntry(n, dtype_name(state[n]), tuple(state[n].shape), d) for n, d in zip(names, digests, strict=True)
    )


def delta_state_checksum(delta: Delta) -> str | None:
    """The state checksum of a delta's target, from its table alone (no tensor is read).

    Valid only once the delta has been applied with target verification (`rlboost.delta.apply_`, the default):
    then every tensor's bits hash to its entry's target_xxh3, and the table names every tensor of the state.
    None when the delta's hash block is not DEFAULT_BLOCK_BYTES (its digests are then of other blocks): the
    caller recomputes `state_checksum` from the tensors.
    """
    if delta.block_bytes != DEFAULT_BLOCK_BYTES:
        return None
    return checksum_of_listing(ListingEntry(e.name, e.dtype, tuple(e.shape), e.target_xxh3) for e in delta.tensors)


def tensor_checksums(bufs: Sequence[memoryview], threads: int = THREADS) -> list[int]:
    """rlboost.delta.format.tensor_checksum of each buffer (DEFAULT_BLOCK_BYTES blocks), the blocks of all of
    them split into `threads` contiguous runs of about equal bytes, one per thread."""
    bb = DEFAULT_BLOCK_BYTES
    sizes = [len(b) for b in bufs]
    total = sum(sizes)
    if threads <= 1 or total < _PARALLEL_MIN_BYTES:
        runs = [[(i, 0, _nblocks(n)) for i, n in enumerate(sizes)]]
        parts = [_hash_run(bufs, runs[0])]
    else:
        runs = _split(sizes, threads)
        pool = _shared_pool(threads)
        parts = [f.result() for f in [pool.submit(_hash_run, bufs, run) for run in runs]]
    per: list[list[int]] = [[] for _ in bufs]
    for run, digests in zip(runs, parts, strict=True):  # runs are in tensor then block order
        for (i, _, _), ds in zip(run, digests, strict=True):
            per[i].extend(ds)
    return [combine_digests(ds, n, bb) for ds, n in zip(per, sizes, strict=True)]


Run = list[tuple[int, int, int]]  # (buffer index, first block, stop block), in order


def _nblocks(nbytes: int) -> int:
    return -(-nbytes // DEFAULT_BLOCK_BYTES)


def _split(sizes: Sequence[int], parts: int) -> list[Run]:
    """Cut the concatenated blocks of all buffers into at most `parts` contiguous runs of about equal bytes (at
    block boundaries: a large tensor may be split between runs)."""
    bb = DEFAULT_BLOCK_BYTES
    total = sum(sizes)
    cuts = [total * k / parts for k in range(1, parts)]
    runs: list[Run] = [[]]
    done = 0  # bytes in the blocks placed so far
    for i, n in enumerate(sizes):
        for b in range(_nblocks(n)):
            size = min(bb, n - b * bb)
            if len(runs) < parts and done + size / 2 > cuts[len(runs) - 1]:  # the block lies mostly past the cut
                runs.append([])
            run = runs[-1]
            if run and run[-1][0] == i:
                run[-1] = (i, run[-1][1], b + 1)
            else:
                run.append((i, b, b + 1))
            done += size
    return runs


def _hash_run(bufs: Sequence[memoryview], run: Run) -> list[list[int]]:
    return [block_digests(bufs[i], DEFAULT_BLOCK_BYTES, first, stop) for i, first, stop in run]


def _shared_pool(threads: int) -> ThreadPoolExecutor:
    """One small pool per thread count and process, made on first use (its jobs never submit to it)."""
    with _pool_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="state-checksum")
        return _pools[threads]


def legacy_state_checksum(state: Mapping[str, torch.Tensor]) -> str:
    """The former definition (rlboost before per-tensor xxh3): sha256 over name, dtype, shape and every raw byte,
    one thread, ~1 GB/s. Only to tell a user that a checkpoint's recorded checksum is of that definition."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name]
        h.update(f"{name}|{dtype_name(t)}|{tuple(t.shape)}\n".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()
