"""Tasks with a verifiable reward: a seeded prompt set, a resumable batch order, pluggable rewards.

`make_task(spec.task)` builds the task; `load_reward(spec.task.reward)` resolves its reward function.
Torch-free on purpose: any service may import this package.
"""

from __future__ import annotations

from rlboost.tasks.base import Example, Task, make_task
from rlboost.tasks.rewards import RewardFn, RewardLoadError, load_reward

__all__ = ["Example", "RewardFn", "RewardLoadError", "Task", "load_reward", "make_task"]
