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
