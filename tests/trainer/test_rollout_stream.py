"""A step's rollout as batches (trainer.rollout_stream) and how an arriving sample is classified
(trainer.assembly.classify), against a stand-in RolloutClient: no manager, no deadline."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rlboost.wire.rollout_io import RolloutRequest, SamplingParams, Trajectory
from tests.trainer.conftest import tiny_spec
from trainer.assembly import classify
from trainer.batching import StepAssembler
from trainer.rollout_client import RolloutError
from trainer.rollout_stream import RolloutStream


def _traj(p: int, g: int, version: int = 3, reason: str = "stop") -> Trajectory:
    return Trajectory(f"s0-p{p}-g{g}", 0, p, g, [1], [2, 3], [-1.0, -1.0], reason, version)


def _request(version: int = 3) -> RolloutRequest:
    return RolloutRequest(0, version, [], 2, SamplingParams(1.0, 1.0, 0, 4, 0, ()), 0)


class _Client:
    """Sends its trajectories with a pause after `pause_after` of them, then fails if told to."""

    def __init__(self, trajs: list[Trajectory], pause_after: int, fail: bool = False) -> None:
        self.trajs, self.pause_after, self.fail = trajs, pause_after, fail

    async def rollout(self, request: RolloutRequest, reattach_s: float = 0.0):
        for i, traj in enumerate(self.trajs):
            if i == self.pause_after:
                await asyncio.sleep(0.05)
            yield traj
        if self.fail:
            raise RolloutError("no workers left")


async def _batches(client: _Client) -> list[list[Trajectory]]:
    stream = RolloutStream(tiny_spec().rollout, reattach_s=0.0)
    got = []
    async with contextlib.aclosing(stream.batches(client, _request(), StepAssembler(0, 2, 2, 2))) as batches:  # type: ignore[arg-type]
        async for batch in batches:
            got.append(batch)
            await asyncio.sleep(0.02)  # the consumer is busy: what arrives meanwhile is one batch
    return got


async def test_trajectories_arrive_in_batches_of_what_came_meanwhile_in_order() -> None:
    trajs = [_traj(p, g) for p in range(2) for g in range(2)]
    got = await _batches(_Client(trajs, pause_after=1))
    assert [t for batch in got for t in batch] == trajs and len(got) >= 2


async def test_a_stream_failure_is_raised_after_what_arrived() -> None:
    with pytest.raises(RolloutError, match="no workers left"):
        await _batches(_Client([_traj(0, 0)], pause_after=5, fail=True))


def test_a_sample_is_on_policy_stale_within_the_bound_or_weightless() -> None:
    request = _request(version=3)
    assert classify(request.weight_version, _traj(0, 0, version=3), max_staleness=1) == (False, 1.0)
    assert classify(request.weight_version, _traj(0, 0, version=2), max_staleness=1) == (True, 1.0)
    assert classify(request.weight_version, _traj(0, 0, version=1), max_staleness=1) == (False, 0.0)  # too old: no loss
    assert classify(request.weight_version, _traj(0, 0, reason="failed"), max_staleness=1) == (False, 0.0)  # dropped
