"""The agentic-episode fields of a step's report (task.environment): turns per episode, tool calls, their failures
and latency, environments that failed, from the step's episodes; env-runner utilisation and the slot-seconds
engines waited for tools, from the rollout-manager's status after the step. Zeros for single-turn samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlboost.wire.rollout_io import ManagerStatus
from trainer.grpo import Sample


def episode_fields(samples: Sequence[Sample]) -> dict[str, Any]:
    """StepReport's episode fields that the step's episodes give (empty for single-turn samples)."""
    episodes = [s.trajectory for s in samples if s.trajectory.turns or s.trajectory.episode is not None]
    if not episodes:
        return {}
    stats = [t.episode for t in episodes if t.episode is not None]
    calls = sum(e.tool_calls for e in stats)
    env_calls = sum(t.turns for t in episodes) + len(episodes)  # a reset and a step per turn each
    return {
        "episode_turns_mean": sum(t.turns for t in episodes) / len(episodes),
        "episode_turns_max": max(t.turns for t in episodes),
        "tool_calls": calls,
        "tool_failures": sum(e.tool_failures for e in stats),
        "tool_latency_seconds": sum(e.tool_seconds for e in stats) / env_calls,
        "environment_failures": sum(bool(e.env_error) for e in stats),
    }


class RunnerMeter:
    """The env-runners' utilisation and the idle slot-seconds since the previous status read (growths of the
    manager's totals; a restarted manager counts anew)."""

    def __init__(self) -> None:
        self._last = (0.0, 0.0, 0.0)  # the manager's idle slot-, episode- and capacity-seconds at the previous read

    def update(self, status: ManagerStatus | None) -> dict[str, Any]:
        if status is None or not status.runners:
            return {}
        e = status.episodes
        now = (e.idle_slot_seconds_in_tools, e.runner_episode_seconds, e.runner_capacity_seconds)
        grown = [b - a if b >= a else b for a, b in zip(self._last, now, strict=True)]
        self._last = now
        return {
            "env_runner_utilisation": min(1.0, grown[1] / grown[2]) if grown[2] > 0 else 0.0,
            "idle_slot_seconds_in_tools": grown[0],
        }
