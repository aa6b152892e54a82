"""`--dump-rollouts`: every trajectory the trainer receives, appended as one JSON line (a debugging output)."""

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
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
