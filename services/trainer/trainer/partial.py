"""Partial rollout (algorithm.partialRollout) on the trainer's side: GRPO groups in flight across steps.

Each step asks for new prompts up to promptsPerStep x (1 + partialRolloutOverProvision) groups in flight, lists the
samples of earlier steps' groups it still waits for (RolloutRequest.carried), and the rollout-manager ends the
step's stream once promptsPerStep groups are complete. A group's finished samples are kept until the whole group is
in (advantages are per group); it is trained in the step where it completes, in canonical (step, prompt, sample)
order. Its samples' lag is counted by their oldest token's weight version (Trajectory.weight_version) against
maxStaleness, as for any stale sample, and the importance ratio uses their per-token behaviour log-probs. The
counts and bounds are the shared rules of `rlboost.policies.partial_rollout` (also the manager's and the simulator's).

Checkpoints record where each open group's prompt was taken from (the data cursor of its batch and its offset), not
its samples: on resume those groups are taken again from the data and rolled out afresh (counted in
`regenerated`), so none is lost and none trained twice (a group is trained only once complete). Torch-free.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from rlboost.tasks.base import Cursor
from rlboost.tasks.sandbox import RewardResult
from rlboost.wire.rollout_io import CarriedGroup, Trajectory


class CarryError(ValueError):
    """A trajectory of no group the trainer waits for."""


@dataclass
class OpenGroup:
    """One prompt's group in flight: its example, prompt, where the prompt came from, and the samples in so far."""

    step: int
    prompt_index: int
    example: Any
    prompt_ids: list[int]
    source: tuple[dict[str, int], int]  # (data cursor of the step's batch, offset in it): to take it again on resume
    samples: dict[int, tuple[Trajectory, RewardResult]] = field(default_factory=dict)  # sample index -> (it, reward)
    task_json: str = ""  # agentic episodes (task.environment): the environment's task, for CarriedGroup.task_json


class GroupCarry:
    """Every group in flight, across steps. Also the progress view of the current step's stream (`_read`)."""

    def __init__(self, group_size: int, episodes: bool = False) -> None:
        self.group_size = group_size
        self.episodes = episodes  # task.environment: each group is an environment task's episodes
        self.groups: dict[tuple[int, int], OpenGroup] = {}
        self.regenerated = 0  # groups rolled out afresh after a resume
        self.received = 0  # trajectories of the current step's stream
        self.total = 0  # trajectories the current step's stream owes

    def __len__(self) -> int:
        return len(self.groups)

    def open(self, step: int, examples: list[Any], prompt_ids: list[list[int]], cursor: Cursor) -> None:
        """The step's new prompts (taken from the data at `cursor`)."""
        source = {"epoch": cursor.epoch, "position": cursor.position}
        for i, (example, ids) in enumerate(zip(examples, prompt_ids, strict=True)):
            self.groups[(step, i)] = OpenGroup(step, i, example, ids, (source, i), task_json=self._task(example))

    def carried(self, step: int) -> list[CarriedGroup]:
        """Earlier steps' groups with samples still owed, and which."""
        return [
            CarriedGroup(g.step, g.prompt_index, g.prompt_ids, self._missing(g), g.task_json)
            for g in self.groups.values()
            if g.step < step
        ]

    def start_stream(self, step: int) -> None:
        self.received = 0
        self.total = sum(len(self._missing(g)) for g in self.groups.values())

    def missing(self) -> list[tuple[int, int, int]]:
        """(step, prompt, sample) of every sample still owed."""
        return [(g.step, g.prompt_index, s) for g in self.groups.values() for s in self._missing(g)]

    def owed(self) -> int:
        return sum(len(self._missing(g)) for g in self.groups.values())

    def wants(self, traj: Trajectory) -> bool:
        """False for a sample already in (re-sent by a retried rollout); CarryError for one of no open group."""
        group = self.groups.get((traj.step, traj.prompt_index))
        if group is None or not 0 <= traj.sample_index < self.group_size:
            raise CarryError(
                f"trajectory {traj.request_id}: (step, prompt_index, sample_index)=({traj.step}, {traj.prompt_index}, "
                f"{traj.sample_index}) belongs to no group in flight"
            )
        return traj.sample_index not in group.samples

    def examples_of(self, step: int) -> dict[int, Any]:
        """prompt index -> example of the step's groups still in flight (for the reward)."""
        return {g.prompt_index: g.example for g in self.groups.values() if g.step == step}

    def add(self, traj: Trajectory, reward: RewardResult) -> None:
        self.groups[(traj.step, traj.prompt_index)].samples[traj.sample_index] = (traj, reward)
        self.received += 1

    def take_complete(self) -> list[OpenGroup]:
        """The groups whose every sample is in, in canonical order; they leave the carry."""
        done = sorted(k for k, g in self.groups.items() if len(g.samples) == self.group_size)
        return [self.groups.pop(k) for k in done]

    # ---- checkpoints ----

    def checkpoint(self) -> list[dict[str, Any]]:
        """Where each open group's prompt came from (its samples are not kept: see the module docstring)."""
        return [
            {"step": g.step, "prompt_index": g.prompt_index, "cursor": g.source[0], "offset": g.source[1]}
            for g in self.groups.values()
        ]

    def restore(self, saved: list[dict[str, Any]], prompts: Any) -> None:
        """Take the checkpointed open groups' prompts again from the data (`prompts.take`), to roll out afresh."""
        for s in saved:
            batch = prompts.take(Cursor(**s["cursor"]), s["offset"] + 1)
            example, ids = batch.examples[s["offset"]], batch.prompt_ids[s["offset"]]
            source = (s["cursor"], s["offset"])
            group = OpenGroup(s["step"], s["prompt_index"], example, ids, source, task_json=self._task(example))
            self.groups[(s["step"], s["prompt_index"])] = group
        self.regenerated += len(saved)

    def _task(self, example: Any) -> str:
        return episode_task(example) if self.episodes else ""

    def _missing(self, g: OpenGroup) -> list[int]:
        return [s for s in range(self.group_size) if s not in g.samples]


def episode_task(example: Any) -> str:
    """An example as an environment's task (PromptItem.task_json, CarriedGroup.task_json): the dataset row as JSON."""
    return json.dumps(asdict(example))
