"""Rank coordination of the multi-rank trainer: rank 0 leads, every other rank follows its broadcasts.

Choice: rank 0 alone talks to the rollout-manager, the weight-server and NATS. As a step's micro-batches
become ready it collates a *round* of `world_size` of them and broadcasts it (torch.distributed
`broadcast_object_list` on the default group: gloo on CPU); rank r trains micro-batch r of the round.
Micro-batch k of a step therefore always lands on rank k mod world_size whatever the arrival order, every
rank runs the same number of backward passes, and the step is reproducible. A step whose micro-batches do not
fill its last round (partial rollout trains however many groups completed) has that round completed with
weightless rows (`complete_round`): every rank must run one backward pass per round, because ZeRO reduces
gradients with collectives inside backward hooks, and a weightless row adds exactly 0 to loss, gradient and
statistics. DeepSpeed averages gradients over ranks; the engine scales each rank's loss by world_size so that a
step's gradient is the sum of its micro-batches' gradients, whatever the number of ranks. Then every rank takes
part in the optimizer step, the statistics all-reduce, the ZeRO-3 parameter gathers for publication and the
collective checkpoint; only rank 0 publishes.

Messages: trainer.rank_messages (ResumeFrom, then per step its TrainRounds and an OptimizerStep, then Stop); what
the other ranks do with them: trainer.followers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from trainer.grpo import MAX_STATS, LossStats, MicroBatch

_FIELDS = tuple(f.name for f in dataclasses.fields(LossStats))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _multi() -> bool:
    import torch.distributed as dist

    return dist.is_initialized() and dist.get_world_size() > 1


def broadcast(obj: Any = None) -> Any:
    """Rank 0 sends `obj`; every rank returns it (no-op with one rank). Blocking: call it from a thread."""
    if not _multi():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank ([obj] with one rank). Blocking: call it from a thread."""
    if not _multi():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def complete_round(mbs: list[MicroBatch], world: int) -> list[MicroBatch]:
    """`mbs` (1 to `world` real micro-batches, real ones first so micro-batch k stays on rank k mod world) padded to
    `world` with weightless rows (MicroBatch.weightless_row): one backward pass per rank."""
    if not 1 <= len(mbs) <= world:
        raise ValueError(f"a round has 1 to {world} micro-batches (one per rank), got {len(mbs)}")
    return mbs + [mbs[-1].weightless_row() for _ in range(world - len(mbs))]


def all_reduce_stats(loss: float, stats: LossStats) -> tuple[float, LossStats]:
    """Sum a step's loss and diagnostics over ranks (float64, so the integers stay exact); the MAX_STATS by max."""
    if not _multi():
        return loss, stats
    import torch.distributed as dist

    summed = [f for f in _FIELDS if f not in MAX_STATS]
    t = torch.tensor([loss, *(float(getattr(stats, f)) for f in summed)], dtype=torch.float64)
    dist.all_reduce(t)
    top = torch.tensor([float(getattr(stats, f)) for f in MAX_STATS], dtype=torch.float64)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    values = dict(zip(summed, t.tolist()[1:], strict=True)) | dict(zip(MAX_STATS, top.tolist(), strict=True))
    kinds = {f.name: f.type for f in dataclasses.fields(LossStats)}
    return t[0].item(), LossStats(**{f: int(v) if kinds[f] in (int, "int") else v for f, v in values.items()})


def shutdown(timeout_s: float = 30.0) -> None:
    """End the process group cleanly once every rank is done. Without it a rank's gloo threads can be torn down
    by the interpreter's exit while a peer's connection closes, which aborts the process ('terminate called
    without an active exception', exit -6) after the job succeeded: a pod that fails after finishing."""
    if not _multi():
        return
    import contextlib
    from datetime import timedelta

    import torch.distributed as dist

    with contextlib.suppress(RuntimeError):  # a rank that never arrives (it failed) must not hold this one's exit
        dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    dist.destroy_process_group()
