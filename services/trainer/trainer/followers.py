"""What ranks other than 0 do: follow rank 0's broadcasts (trainer.rank_messages) until it says stop.

They talk to no peer (no NATS, manager or weight-server): they load the checkpoint rank 0 chose, train their share
of each round, take part in each optimizer step (statistics all-reduce, state gather) and in the collective
checkpoint saves. See trainer.ranks for why every rank runs the same rounds.
"""

from __future__ import annotations

from pathlib import Path

from rlboost import gc_pauses
from trainer import ranks
from trainer.rank_messages import OptimizerStep, RankMessage, ResumeFrom, ScoreRound, Stop, TrainRound
from trainer.resume import Checkpoints
from trainer.tally import TrainSums
from trainer.training import StepTrainer


def follow(training: StepTrainer, checkpoints: Checkpoints) -> int:
    """Blocking (call it in a thread): do what rank 0 says until Stop; returns the steps taken."""
    start = _expect(ranks.broadcast(), ResumeFrom)
    training.restore(Path(start.checkpoint) if start.checkpoint else None)
    gc_pauses.freeze_after_start()  # as rank 0's loop: start-up's objects out of every full collection
    sums, steps = TrainSums(), 0
    while True:
        msg: RankMessage = ranks.broadcast()
        if isinstance(msg, TrainRound):
            loss, stats = training.train_share(msg)
            sums.add(loss, stats, 0.0)
        elif isinstance(msg, ScoreRound):
            training.score_share(msg)
        elif isinstance(msg, OptimizerStep):
            training.finish_step(sums.loss, sums.stats)
            if msg.save is not None:  # rank 0 writes its part after publishing; the save is collective
                checkpoints.write(training.engine, msg.save)
            steps, sums = steps + 1, TrainSums()
        elif isinstance(msg, Stop):
            return steps
        else:
            raise _unknown(msg)


def _expect(msg: object, kind: type[ResumeFrom]) -> ResumeFrom:
    if not isinstance(msg, kind):
        raise _unknown(msg)
    return msg


def _unknown(msg: object) -> RuntimeError:
    op = getattr(msg, "op", type(msg).__name__)
    return RuntimeError(f"rank {ranks.rank()}: unknown message {op!r} from rank 0")
