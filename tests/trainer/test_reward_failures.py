"""The trainer's reward scoring: failed calls score 0 and count in rlboost_trainer_reward_failures_total{reason}.

Real sandbox processes and a real misbehaving reward package (tests/rlboost/reward_plugins.py). The trainer's
Judge decodes through a table from token ids to text instead of the model's tokenizer, because scoring is what is
tested here, not the tokenizer.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from rlboost.spec import parse_job_spec
from rlboost.tasks.base import Example
from rlboost.tasks.sandbox import RewardSandbox, SandboxLimits
from rlboost.wire.rollout_io import Trajectory
from tests.rlboost import reward_plugins
from trainer.judge import Judge

TEXTS = {1: "3", 2: "exit", 3: "raise", 4: "4"}


def _failures(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_trainer_reward_failures_total", {"reason": reason}) or 0.0


def test_failed_reward_calls_score_zero_and_are_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = reward_plugins.install(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    spec = parse_job_spec({"task": {"reward": "chaos", "rewardProcesses": 1}})
    judge = Judge(spec.task, lambda ids: TEXTS[ids[0]])
    examples = [Example("What is 1+2?", "3")]
    trajs = [Trajectory(f"r{i}", 0, 0, i, [0], [t], [-1.0], "stop", 0) for i, t in enumerate([1, 2, 3, 4, 1])]
    before = {r: _failures(r) for r in ("crash", "exception")}
    with RewardSandbox("chaos", SandboxLimits.from_task(spec.task)) as sandbox:
        judge.sandbox = sandbox
        rewards = asyncio.run(judge.rewards(0, examples, trajs))
    assert rewards == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert _failures("crash") == before["crash"] + 1
    assert _failures("exception") == before["exception"] + 1


def test_a_steps_reward_budget_spans_its_batches_and_each_sample_carries_its_failure_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: task.rewardStepBudgetSeconds bounds a step's reward time over all of its streamed batches. The first
    batch's hang is cut by the budget; a later batch of the same step finds none left (every sample 'budget',
    unscored), while the next step has a budget of its own. The kinds are counted, and a sample keeps its kind
    (grpo.Sample.reward_failure) for the advantage code to leave it out of its group's baseline."""
    from trainer.batching import StepAssembler

    root = reward_plugins.install(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    task = {"reward": "chaos", "rewardProcesses": 1, "rewardTimeoutSeconds": 600, "rewardStepBudgetSeconds": 2}
    spec = parse_job_spec({"task": task})
    texts = {1: "3", 5: "hang"}
    judge = Judge(spec.task, lambda ids: texts[ids[0]])
    examples = [Example("What is 1+2?", "3")]

    def trajs(step: int, tokens: list[int]) -> list[Trajectory]:
        return [Trajectory(f"s{step}-{i}", step, 0, i, [0], [t], [-1.0], "stop", 0) for i, t in enumerate(tokens)]

    async def steps() -> tuple[list, list, list]:
        # one event loop, as in the trainer: a replaced process lives as long as the thread that started it
        first = await judge.judge(0, examples, trajs(0, [5]))
        return first, await judge.judge(0, examples, trajs(0, [1, 1])), await judge.judge(1, examples, trajs(1, [1]))

    before = _failures("budget")
    with RewardSandbox("chaos", SandboxLimits.from_task(spec.task)) as sandbox:
        judge.sandbox = sandbox
        first, later, next_step = asyncio.run(steps())
    assert [r.failure for r in first + later] == ["budget"] * 3 and later[0].detail.startswith("not scored")
    assert [(r.value, r.failure) for r in next_step] == [(1.0, None)], next_step
    assert _failures("budget") == before + 3

    asm = StepAssembler(0, num_prompts=1, group_size=3, micro_batch_size=3)
    for traj, result in zip(trajs(0, [5, 1, 1]), first + later, strict=True):
        asm.add(traj, result.value, reward_failure=result.failure)
    assert [s.reward_failure for s in asm.samples()] == ["budget"] * 3
