"""The judge: rewards of trajectories from the reward sandbox (rlboost.tasks.sandbox), rank 0 only.

A failed reward call scores 0, is counted by reason (rlboost_trainer_reward_failures_total) and logged once per
batch; a sample the rollout-manager dropped (finish_reason 'failed') is not judged and scores 0. An agentic
episode whose environment scored it (Trajectory.reward) keeps that reward; otherwise task.reward judges the
episode's whole text after its first prompt.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlboost.reward_registry import describe_reward
from rlboost.spec import TaskSpec
from rlboost.tasks.sandbox import RewardResult, RewardSandbox, SandboxLimits
from rlboost.wire.rollout_io import Trajectory
from trainer import metrics

log = logging.getLogger(__name__)

FAILED = "failed"  # finish_reason of a sample the rollout-manager dropped (rollout.onFailedRequest: drop)


def _needs_reward(t: Trajectory) -> bool:
    """task.reward judges it: not dropped, and (an agentic episode) its environment gave no reward."""
    return t.finish_reason != FAILED and t.reward is None


def _given(t: Trajectory) -> RewardResult:
    """A dropped sample's 0, or the reward its environment gave (an agentic episode)."""
    return RewardResult(0.0 if t.finish_reason == FAILED or t.reward is None else float(t.reward))


class Judge:
    """Scores trajectories against their examples in the reward sandbox it starts and closes."""

    def __init__(self, task: TaskSpec, decode: Callable[[list[int]], str]) -> None:
        self.task, self.decode = task, decode
        self.sandbox: RewardSandbox | None = None  # set by start() (or given, by a test)

    def start(self) -> None:
        """Start the sandbox's processes (blocking: call it in a thread); a reward that cannot start fails here."""
        self.sandbox = RewardSandbox(self.task.reward, SandboxLimits.from_task(self.task))
        self.sandbox.start()

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()

    async def rewards(
        self, step: int, examples: Sequence[Any] | Mapping[int, Any], trajs: list[Trajectory]
    ) -> list[float]:
        """The reward values of trajectories of `examples` (see `judge`)."""
        return [r.value for r in await self.judge(step, examples, trajs)]

    async def judge(
        self, step: int, examples: Sequence[Any] | Mapping[int, Any], trajs: list[Trajectory]
    ) -> list[RewardResult]:
        """The rewards of trajectories of `examples` (indexed by prompt_index) from the reward sandbox. The
        trajectories were validated (their prompt_index is one of `examples`)."""
        assert self.sandbox is not None
        judged = [t for t in trajs if _needs_reward(t)]  # dropped (0) or scored by its environment: not judged
        items = [(self.decode(t.response_ids), examples[t.prompt_index]) for t in judged]
        results = await asyncio.to_thread(self.sandbox.score, items) if items else []
        self._count_failures(step, results)
        scored = iter(results)
        return [next(scored) if _needs_reward(t) else _given(t) for t in trajs]

    def _count_failures(self, step: int, results: list[RewardResult]) -> None:
        failed: dict[str, int] = {}
        for r in results:
            if r.failure is not None:
                metrics.REWARD_FAILURES.labels(r.failure).inc()
                failed[r.failure] = failed.get(r.failure, 0) + 1
        if failed:
            detail = next(r.detail for r in results if r.failure is not None)
            log.warning(
                "reward calls failed: those samples score 0",
                extra={"step": step, "failures": failed, "first": detail, "reward": describe_reward(self.task.reward)},
            )
