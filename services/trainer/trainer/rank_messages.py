"""The messages rank 0 broadcasts to the other ranks (trainer.ranks.broadcast), one type per message.

They cross processes pickled by torch.distributed's `broadcast_object_list`, so every rank runs this same module.
A run's conversation: one ResumeFrom, then per step its ScoreRounds (algorithm.klInReward), its TrainRounds and one
OptimizerStep, then Stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from trainer.checkpoint import TrainerState
    from trainer.grpo import MicroBatch


@dataclass(frozen=True)
class ResumeFrom:
    """Where training starts: every rank loads the same checkpoint (or none), then gathers the state to publish."""

    op: ClassVar[str] = "resume"
    checkpoint: str | None  # the checkpoint directory rank 0 chose; None: the model directory's weights


@dataclass(frozen=True)
class TrainRound:
    """One round of a step: a micro-batch per rank, each rank runs its forward and backward pass."""

    op: ClassVar[str] = "round"
    micro_batches: list[MicroBatch]  # world_size of them: rank r trains micro_batches[r] (trainer.ranks)
    num_sequences: int  # the step's sample count, by which every rank normalises its loss


@dataclass(frozen=True)
class ScoreRound:
    """algorithm.klInReward, before a step trains: a micro-batch per rank, each rank sums each row's KL to the
    reference (no gradient) and the sums are gathered to every rank (trainer.ranks.all_gather)."""

    op: ClassVar[str] = "score"
    micro_batches: list[MicroBatch]  # world_size of them: rank r scores micro_batches[r]


@dataclass(frozen=True)
class OptimizerStep:
    """The step's rounds are done: every rank steps the optimizer, all-reduces the statistics, gathers the state."""

    op: ClassVar[str] = "step"
    save: TrainerState | None  # the checkpoint to write (collectively) after publication; None: none this step


@dataclass(frozen=True)
class Stop:
    """Training is over: the followers return."""

    op: ClassVar[str] = "stop"


RankMessage = ResumeFrom | TrainRound | ScoreRound | OptimizerStep | Stop
