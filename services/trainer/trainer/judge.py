"""The judge: rewards of trajectories from the reward sandbox (rlboost.tasks.sandbox), rank 0 only.

A failed reward call scores 0, is counted by reason (rlboost_trainer_reward_failures_total) and logged once per
batch; a sample the rollout-manager dropped (finish_reason 'failed') is not judged and scores 0. An agentic
episode whose environment scored it (Trajectory.reward) keeps that reward; otherwise task.reward judges the
episode's whole text after its first prompt.

A step's reward time is bounded (issue 31 item 4): the sandbox is given what is left of the step's budget
(task.rewardStepBudgetSeconds, the time its earlier batches took deducted); a sample it cuts or never starts fails
with the kind 'budget', a sample past its own limit with 'timeout'. Each result carries its kind
(RewardResult.failure): the step's samples keep it (grpo.Sample.reward_failure), the report counts it per kind
(StepReport.reward_failures) and the advantage code keeps such samples out of their group's baseline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlboost.reward_registry import describe_reward
from rlboost.spec import TaskSpec
from rlboost.tasks.sandbox import RewardResult, RewardSandbox, SandboxLimits
from rlboost.wire.rollout_io import Trajectory
from trainer import metrics

log = logging.getLogger(__name__)

FAILED = "failed"  # finish_reason of a sample the rollout-manager dropped (rollout.onFailedRequest: drop)
_BUDGETS_KEPT = 8  # steps whose reward time spent is remembered (partial rollout judges a group's older step)


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
        self._spent: dict[object, float] = {}  # reward seconds spent per step (per budget key), the newest last

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
        self,
        step: int,
        examples: Sequence[Any] | Mapping[int, Any],
        trajs: list[Trajectory],
        budget: object = None,
    ) -> list[RewardResult]:
        """The rewards of trajectories of `examples` (indexed by prompt_index) from the reward sandbox. The
        trajectories were validated (their prompt_index is one of `examples`). `budget`: whose reward budget the
        time counts against (default: the step's; an evaluation has its own)."""
        assert self.sandbox is not None
        judged = [t for t in trajs if _needs_reward(t)]  # dropped (0) or scored by its environment: not judged
        items = [(self.decode(t.response_ids), examples[t.prompt_index]) for t in judged]
        key = step if budget is None else budget
        started = time.monotonic()
        results = await asyncio.to_thread(self.sandbox.score, items, self._deadline(key, started)) if items else []
        self._spend(key, time.monotonic() - started)
        self._count_failures(step, results)
        scored = iter(results)
        return [next(scored) if _needs_reward(t) else _given(t) for t in trajs]

    def _deadline(self, key: object, now: float) -> float | None:
        """When the budget of `key` runs out, given what its earlier batches spent (None: no budget)."""
        budget = self.task.reward_step_budget_seconds
        return None if budget <= 0 else now + max(0.0, budget - self._spent.get(key, 0.0))

    def _spend(self, key: object, seconds: float) -> None:
        self._spent[key] = self._spent.pop(key, 0.0) + seconds
        while len(self._spent) > _BUDGETS_KEPT:
            del self._spent[next(iter(self._spent))]

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
