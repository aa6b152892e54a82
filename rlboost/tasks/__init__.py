"""Tasks with a verifiable reward: a seeded prompt set, a resumable batch order, pluggable rewards.

`make_task(spec.task)` builds the task; `RewardSandbox(spec.task.reward)` (rlboost.tasks.sandbox) runs its reward
confined, by entry point name (rlboost.reward_registry).
Torch-free on purpose: any service may import this package.
"""

from __future__ import annotations

from rlboost.tasks.base import Example, Task, make_task
from rlboost.tasks.rewards import RewardFn

__all__ = ["Example", "RewardFn", "Task", "make_task"]
