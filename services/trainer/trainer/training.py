"""The policy engine's side of a step, on every rank: rounds of micro-batches, the optimizer step, the state to
publish, and the engine's part of checkpoints (restore; the collective save).

Rank 0 queues a step's ready micro-batches and trains them in rounds, one micro-batch per rank (trainer.ranks:
rank 0 broadcasts each round and keeps the first); the other ranks train their share (trainer.followers). Engine
calls block: rank 0 makes them in a thread, so its event loop keeps receiving trajectories meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlboost.spec import JobSpec
from trainer import ranks
from trainer.grpo import LossStats, MicroBatch, Sample, collate
from trainer.rank_messages import TrainRound
from trainer.tally import TrainSums


@dataclass(frozen=True)
class Trained:
    """A step's optimizer step: its result (trainer.engine.StepResult) and the loss and statistics of every rank."""

    result: Any  # grad_norm, learning_rate
    loss: float  # summed over ranks
    stats: LossStats  # summed over ranks


class StepTrainer:
    """The engine (trainer.engine.PolicyEngine, made by `start`) and rank 0's micro-batches waiting for a round."""

    def __init__(self, model_dir: Path, spec: JobSpec, pad_id: int) -> None:
        self.model_dir, self.spec, self.pad_id = model_dir, spec, pad_id
        self.engine: Any = None
        self.pending: list[list[Sample]] = []  # rank 0: the step's ready micro-batches not yet sent in a round

    def start(self) -> None:
        """Make the engine (blocking: DeepSpeed, the model, the seeds)."""
        from trainer.engine import PolicyEngine

        self.engine = PolicyEngine(self.model_dir, self.spec)

    def restore(self, ckpt: Path | None) -> dict[str, Any]:
        """Every rank (in a thread): load the chosen checkpoint, then gather the state to publish."""
        from trainer import checkpoint

        if ckpt is not None:
            checkpoint.load(self.engine, ckpt)
        return self.engine.publish_state()  # bf16; ZeRO-3: per-rank partition deltas (trainer.partition_delta)

    # ---- rank 0 ----

    def queue(self, micro_batches: list[list[Sample]]) -> None:
        self.pending += micro_batches

    async def train_full_rounds(self, sums: TrainSums, num_sequences: int) -> None:
        """Train the queued micro-batches that fill whole rounds (one per rank); the rest wait for more."""
        world = ranks.world_size()
        while len(self.pending) >= world:
            await self._train_round(sums, self.pending[:world], num_sequences)
            self.pending = self.pending[world:]

    async def train_rest(self, sums: TrainSums, num_sequences: int) -> None:
        """Train every queued micro-batch; a last round short of one per rank is completed (trainer.ranks)."""
        world = ranks.world_size()
        while self.pending:
            await self._train_round(sums, self.pending[:world], num_sequences)
            self.pending = self.pending[world:]

    async def _train_round(self, sums: TrainSums, round_: list[list[Sample]], num_sequences: int) -> None:
        """Send one micro-batch to each rank (rank 0 keeps the first) and train rank 0's."""
        start = time.monotonic()
        mbs = [collate(mb, self.pad_id) for mb in round_]
        loss, stats = await asyncio.to_thread(self._round, mbs, num_sequences)
        sums.add(loss, stats, time.monotonic() - start)

    def _round(self, mbs: list[MicroBatch], num_sequences: int) -> tuple[float, LossStats]:
        mbs = ranks.complete_round(mbs, ranks.world_size())  # a step's last round may be short: see trainer.ranks
        ranks.broadcast(TrainRound(mbs, num_sequences))
        return self.engine.forward_backward(mbs[0], num_sequences)

    # ---- every rank ----

    def train_share(self, round_: TrainRound) -> tuple[float, LossStats]:
        """Ranks > 0: this rank's micro-batch of a round rank 0 broadcast."""
        return self.engine.forward_backward(round_.micro_batches[ranks.rank()], round_.num_sequences)

    def finish_step(self, loss: float, stats: LossStats) -> tuple[Trained, dict[str, Any]]:
        """Every rank: optimizer step, statistics all-reduce, state gather (rank 0's: the state to publish; the
        checkpoint comes after publication)."""
        result = self.engine.step()
        loss, stats = ranks.all_reduce_stats(loss, stats)
        state = self.engine.publish_state()
        return Trained(result, loss, stats), state
