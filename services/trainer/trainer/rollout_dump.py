"""`--dump-rollouts`: every trajectory the trainer receives, appended as one JSON line (a debugging output).

An agentic episode's line also has `turns` (model turns), `loss_mask` (one per `token_ids` entry: 1 the model's
token, 0 the environment's) and `reward` (the environment's, or null when task.reward judged it).

Each sample is in the file once (issue 31 item 6): a trainer that resumes (after a kill, or one the runner
restarted) first keeps only the lines of the steps before the one it continues from, which it will not redo, and a
line is appended whole or not at all (a full disk: rlboost.fsio.WriteFailed naming the file and the flag).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlboost.fsio import append_line, write_text_atomic
from rlboost.wire.rollout_io import Trajectory

log = logging.getLogger(__name__)

WHAT, FLAG = "rollout dump", "--dump-rollouts"


class RolloutDump:
    """Appends trajectories to a JSON-lines file; does nothing without one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: off

    def keep_before(self, step: int) -> None:
        """On resume at `step`: drop the lines of steps from `step` on (and a line a kill cut short): they are
        written again as the resumed run redoes those steps."""
        if self.path is None or not self.path.is_file():
            return
        lines = self.path.read_text().splitlines()
        kept = [line for line in lines if (s := _step_of(line)) is not None and s < step]
        if len(kept) != len(lines):
            write_text_atomic(self.path, "".join(line + "\n" for line in kept), WHAT, FLAG)
            dropped = len(lines) - len(kept)
            log.info("rollout dump cut to the steps before the resumed one", extra={"step": step, "dropped": dropped})

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
        append_line(self.path, json.dumps(line), WHAT, FLAG)


def _step_of(line: str) -> int | None:
    """The step of a dump line, or None for a line that is not one (cut short by a kill)."""
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None
