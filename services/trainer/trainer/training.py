"""The policy engine's side of a step, on every rank: rounds of micro-batches, the optimizer step, the state to
publish, and the engine's part of checkpoints (restore; the collective save).

Rank 0 queues a step's ready micro-batches and trains them in rounds, one micro-batch per rank (trainer.ranks:
rank 0 broadcasts each round and keeps the first); the other ranks train their share (trainer.followers). Engine
calls block: rank 0 makes them in a thread, so its event loop keeps receiving trajectories meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlboost.spec import JobSpec
from trainer import ranks
from trainer.grpo import LossStats, MicroBatch, Sample, collate
from trainer.rank_messages import ScoreRound, TrainRound
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

    async def penalise_kl(self, sums: TrainSums) -> None:
        """algorithm.klInReward, before the step trains: each queued sample's kl_penalty = klCoef x its KL to the
        reference summed over its tokens, at the step's weights (a scoring pass in rounds, like training's); the
        step's KL goes into its statistics. The caller then recomputes the advantages (trainer.advantages)."""
        world, coef = ranks.world_size(), self.spec.algorithm.kl_coef
        for i in range(0, len(self.pending), world):
            round_ = self.pending[i : i + world]
            start = time.monotonic()
            per_rank = await asyncio.to_thread(self._score_round, [collate(mb, self.pad_id) for mb in round_])
            for samples, kls in zip(round_, per_rank, strict=False):  # the padded ranks' rows are not samples
                for sample, kl in zip(samples, kls, strict=True):
                    sample.kl_penalty = coef * kl
                    sums.stats.kl_sum += kl * self.spec.algorithm.updates_per_step  # per pass, as the tokens
            sums.compute_s += time.monotonic() - start

    def _score_round(self, mbs: list[MicroBatch]) -> list[list[float]]:
        mbs = ranks.complete_round(mbs, ranks.world_size())
        ranks.broadcast(ScoreRound(mbs))
        return ranks.all_gather(self.engine.sequence_kl(mbs[0]))

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

    def score_share(self, round_: ScoreRound) -> None:
        """Ranks > 0: this rank's micro-batch of a scoring round, its KL sums gathered to rank 0."""
        ranks.all_gather(self.engine.sequence_kl(round_.micro_batches[ranks.rank()]))

    def finish_step(self, loss: float, stats: LossStats) -> tuple[Trained, dict[str, Any]]:
        """Every rank: the optimizer update(s), statistics all-reduce, state gather (rank 0's: the state to publish;
        the checkpoint comes after publication)."""
        result, loss, stats = self.update(loss, stats)
        loss, stats = ranks.all_reduce_stats(loss, stats)
        state = self.engine.publish_state()
        return Trained(result, loss, stats), state

    def update(self, loss: float, stats: LossStats) -> tuple[Any, float, LossStats]:
        """Every rank: the step's optimizer update(s); (the last update's result, the step's loss, statistics).

        algorithm.updatesPerStep U > 1: after the first update each further one replays the step's micro-batches
        against their first pass's old log-probs (trainer.engine.replay). The step reports the mean loss and
        gradient norm over its U updates, and its statistics over all passes' tokens (the trainer/worker gap:
        the first pass's only). 'token-mean': the loss shares are rescaled by the update's loss scale."""
        updates = self.spec.algorithm.updates_per_step
        self.engine.keep_behaviour()  # the next step's stale rows were sampled from these weights, once published
        result = self.engine.step()
        loss, norms = loss * result.loss_scale, [result.grad_norm]
        for _ in range(updates - 1):
            more_loss, more_stats = self.engine.replay()
            result = self.engine.step()
            loss, stats, norms = loss + more_loss * result.loss_scale, stats + more_stats, [*norms, result.grad_norm]
        self.engine.end_step()
        if updates > 1:
            result = dataclasses.replace(result, grad_norm=sum(norms) / updates)
            loss /= updates
        return result, loss, stats
