"""Rank messages (trainer.rank_messages) and what a follower rank does with them (trainer.followers), on a scripted
conversation: no process group, a stand-in engine side and checkpoint directory that record what they are asked."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from trainer import followers, ranks
from trainer.checkpoint import TrainerState
from trainer.grpo import LossStats, MicroBatch
from trainer.rank_messages import OptimizerStep, ResumeFrom, Stop, TrainRound


def _mb(value: int) -> MicroBatch:
    ids = torch.full((1, 3), value)
    zeros = torch.zeros(1, 2)
    return MicroBatch(
        ids, torch.ones(1, 3, dtype=torch.int64), zeros, zeros, torch.zeros(1, dtype=torch.bool), zeros[0]
    )


def _state() -> TrainerState:
    return TrainerState(
        steps_done=1, weight_version=1, weights_checksum="", world_size=2, zero_stage=2, task_seed=0, prompts_per_step=2
    )


class _Training:
    def __init__(self) -> None:
        self.engine, self.calls = "engine", []

    def restore(self, ckpt: Path | None) -> dict:
        self.calls.append(("restore", ckpt))
        return {}

    def train_share(self, round_: TrainRound) -> tuple[float, LossStats]:
        value = int(round_.micro_batches[1].input_ids[0, 0])  # this stand-in is rank 1
        self.calls.append(("round", value, round_.num_sequences))
        return float(value), LossStats(value, 0, 0.0, 0.0)

    def finish_step(self, loss: float, stats: LossStats) -> tuple:
        self.calls.append(("step", loss, stats.tokens))
        return None, {}


class _Checkpoints:
    def __init__(self) -> None:
        self.written: list = []

    def write(self, engine: object, state: TrainerState) -> None:
        self.written.append((engine, state))


def _script(monkeypatch: pytest.MonkeyPatch, messages: list) -> None:
    sent = iter(messages)
    monkeypatch.setattr(ranks, "broadcast", lambda obj=None: next(sent))
    monkeypatch.setattr(ranks, "rank", lambda: 1)


def test_messages_cross_processes_pickled_with_their_fields() -> None:
    save = _state()
    for msg in (
        ResumeFrom("/ck/step-00000004"),
        ResumeFrom(None),
        TrainRound([_mb(3)], 4),
        OptimizerStep(save),
        Stop(),
    ):
        again = pickle.loads(pickle.dumps(msg))
        assert type(again) is type(msg) and again.op == msg.op
    again = pickle.loads(pickle.dumps(TrainRound([_mb(3), _mb(5)], 4)))
    assert [int(m.input_ids[0, 0]) for m in again.micro_batches] == [3, 5] and again.num_sequences == 4
    assert pickle.loads(pickle.dumps(OptimizerStep(save))).save == save
    assert [m.op for m in (ResumeFrom(None), TrainRound([], 0), OptimizerStep(None), Stop())] == [
        "resume",
        "round",
        "step",
        "stop",
    ]


def test_a_follower_trains_its_share_steps_and_saves_as_told(monkeypatch: pytest.MonkeyPatch) -> None:
    save = _state()
    _script(
        monkeypatch,
        [
            ResumeFrom("/ck/step-00000004"),
            TrainRound([_mb(1), _mb(2)], 4),
            TrainRound([_mb(3), _mb(4)], 4),
            OptimizerStep(save),
            TrainRound([_mb(5), _mb(6)], 2),
            OptimizerStep(None),
            Stop(),
        ],
    )
    training, checkpoints = _Training(), _Checkpoints()
    assert followers.follow(training, checkpoints) == 2  # type: ignore[arg-type]
    assert training.calls == [
        ("restore", Path("/ck/step-00000004")),
        ("round", 2, 4),
        ("round", 4, 4),
        ("step", 6.0, 6),  # the step's sums, then zero again
        ("round", 6, 2),
        ("step", 6.0, 6),
    ]
    assert checkpoints.written == [("engine", save)]  # only the step rank 0 said to save


def test_a_follower_refuses_a_message_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    _script(monkeypatch, [ResumeFrom(None), {"op": "round"}])
    with pytest.raises(RuntimeError, match="rank 1: unknown message 'dict' from rank 0"):
        followers.follow(_Training(), _Checkpoints())  # type: ignore[arg-type]
    _script(monkeypatch, [Stop()])
    with pytest.raises(RuntimeError, match="rank 1: unknown message 'stop' from rank 0"):
        followers.follow(_Training(), _Checkpoints())  # type: ignore[arg-type]
