"""`--dump-rollouts`: every trajectory the trainer receives, appended as one JSON line (a debugging output).

An agentic episode's line also has `turns` (model turns), `loss_mask` (one per `token_ids` entry: 1 the model's
token, 0 the environment's) and `reward` (the environment's, or null when task.reward judged it)."""

from __future__ import annotations

import json
from pathlib import Path

from rlboost.wire.rollout_io import Trajectory


class RolloutDump:
    """Appends trajectories to a JSON-lines file; does nothing without one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: off

    def write(self, traj: Trajectory) -> None:
        if self.path is None:
            return
        line = {
            "step": traj.step,
            "prompt_index": traj.prompt_index,
            "sample_index": traj.sample_index,
            "token_ids": traj.response_ids,
            "weight_version": traj.weight_version,
            "workers": traj.workers,
        }
        if traj.version_spans:  # partial rollout: the versions it was generated under
            line["version_spans"] = traj.version_spans
        if traj.turns:  # an agentic episode: model turns, and which of token_ids are the model's (1) or not (0)
            line["turns"] = traj.turns
            line["loss_mask"] = list(traj.loss_mask) if traj.loss_mask else [1] * len(traj.response_ids)
            line["reward"] = traj.reward
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
