"""A group's baseline leaves out samples the manager dropped, samples whose reward call failed, and samples too stale
to train on (issue 32 item 6): through the whole-groups step's real judge (reward sandbox processes running the
misbehaving reward package of tests/rlboost/reward_plugins.py) and its assembler, and through partial rollout.

Where the stand-in begins: the step is not opened through the prompt cursor (no model, tokenizer or dataset here);
its Rollout request and assembler are set as `open` sets them, and the judge decodes through a table of texts.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rlboost.spec import parse_job_spec
from rlboost.tasks.base import Cursor, Example
from rlboost.tasks.sandbox import RewardResult, RewardSandbox, SandboxLimits
from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams, Trajectory
from tests.rlboost import reward_plugins
from trainer import advantages
from trainer.assembly import WholeGroups
from trainer.batching import StepAssembler
from trainer.judge import Judge
from trainer.partial import GroupCarry
from trainer.partial_assembly import PartialGroups
from trainer.rollout_dump import RolloutDump
from trainer.tally import StepCounts

TEXTS = {1: "3", 2: "exit", 3: "raise", 4: "4"}  # right, crashes the reward, raises in it, wrong


def _traj(g: int, token: int, finish: str = "stop", version: int = 0, step: int = 0) -> Trajectory:
    return Trajectory(f"s{step}-p0-g{g}", step, 0, g, [0], [token], [-1.0], finish, version)


def test_dropped_and_reward_failed_samples_stay_out_of_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    root = reward_plugins.install(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    spec = parse_job_spec({"task": {"reward": "chaos", "rewardProcesses": 1}, "algorithm": {"groupSize": 5}})
    judge = Judge(spec.task, lambda ids: TEXTS[ids[0]])
    steps = WholeGroups(spec, prompts=None, judge=judge, vocab=None, dump=RolloutDump(None))  # type: ignore[arg-type]
    steps.request = RolloutRequest(0, 0, [PromptItem(0, [0])], 5, SamplingParams())
    steps.examples = [Example("What is 1+2?", "3")]
    steps.assembler = StepAssembler(0, num_prompts=1, group_size=5, micro_batch_size=5)
    batch = [_traj(0, 1), _traj(1, 2), _traj(2, 3), _traj(3, 4), _traj(4, 1, finish="failed")]
    counts = StepCounts()
    with RewardSandbox("chaos", SandboxLimits.from_task(spec.task)) as sandbox:
        judge.sandbox = sandbox
        results = asyncio.run(steps.judged(batch))
    assert [r.value for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0]
    (ready,) = steps.add(batch, results, counts)
    reasons = [advantages.REWARD_FAILED, advantages.REWARD_FAILED, "", advantages.DROPPED]
    assert [s.excluded for s in ready] == ["", *reasons]
    # The baseline is the group [1, 0] of the two samples that were scored: +-0.7071; the others get 0 (before:
    # five entries [1, 0, 0, 0, 0] made the right answer's advantage 1.79 and each failure's -0.45).
    assert [s.advantage for s in ready] == pytest.approx([0.7071, 0.0, 0.0, -0.7071, 0.0], rel=1e-3)
    assert counts.baseline_excluded == 3


def test_partial_rollout_leaves_too_stale_and_reward_failed_samples_out_of_the_baseline():
    spec = parse_job_spec({"algorithm": {"groupSize": 4, "maxStaleness": 1, "partialRollout": True}})
    steps = PartialGroups(spec, prompts=None, judge=None, vocab=None, dump=RolloutDump(None))  # type: ignore[arg-type]
    steps.carry = GroupCarry(4)
    steps.carry.open(0, [Example("q", "a")], [[0]], Cursor())
    request = RolloutRequest(2, 2, [], 4, SamplingParams())  # the step at version 2
    batch = [_traj(0, 1, version=2), _traj(1, 1, version=0), _traj(2, 1, version=1), _traj(3, 1, version=2)]
    rewards = [RewardResult(1.0), RewardResult(1.0), RewardResult(0.0), RewardResult(0.0, failure="timeout")]
    counts = StepCounts()
    steps.add(batch, rewards, counts)
    samples = steps._complete_groups(request, steps.carry.take_complete(), counts)
    # Sample 1 lags 2 versions (> maxStaleness 1): weight 0, too stale; sample 3's reward call timed out.
    assert [s.excluded for s in samples] == ["", advantages.TOO_STALE, "", advantages.REWARD_FAILED]
    assert [s.advantage for s in samples] == pytest.approx([0.7071, 0.0, -0.7071, 0.0], rel=1e-3)
    assert counts.baseline_excluded == 2 and counts.off_policy == 1 and counts.stale == 1
