"""--dump-rollouts holds each sample once (issue 31 item 6): a resumed trainer cuts the file to the steps before
the one it continues from (and a line a kill cut short); a line is appended whole or not at all (a full disk)."""

from __future__ import annotations

import json

import pytest

from rlboost.fsio import WriteFailed
from rlboost.wire.rollout_io import Trajectory
from tests.small_fs import fill, mounted_tmpfs
from trainer.rollout_dump import RolloutDump


def _traj(step: int, prompt: int, sample: int) -> Trajectory:
    return Trajectory(f"r{step}-{prompt}-{sample}", step, prompt, sample, [1], [5, 6], [-0.1, -0.2], "stop", step)


def _keys(path) -> list[tuple[int, int, int]]:
    return [(d["step"], d["prompt_index"], d["sample_index"]) for d in map(json.loads, path.read_text().splitlines())]


def test_a_resumed_trainer_redoing_steps_dumps_each_sample_once(tmp_path) -> None:
    path = tmp_path / "rollouts.jsonl"
    first = RolloutDump(path)
    for step in (0, 1, 2):
        for sample in (0, 1):
            first.write(_traj(step, 0, sample))
    with path.open("a") as f:
        f.write('{"step": 2, "prompt_ind')  # the kill landed mid-line
    resumed = RolloutDump(path)
    resumed.keep_before(2)  # resumed from the checkpoint after step 1: step 2 is redone
    for sample in (0, 1):
        resumed.write(_traj(2, 0, sample))
    keys = _keys(path)
    assert keys == [(s, 0, g) for s in (0, 1, 2) for g in (0, 1)] and len(set(keys)) == len(keys)


def test_a_dump_line_that_does_not_fit_is_not_half_written() -> None:
    with mounted_tmpfs("64k") as root:
        dump = RolloutDump(root / "rollouts.jsonl")
        dump.write(_traj(0, 0, 0))
        fill(root, leave=10)
        big = _traj(0, 0, 1)
        big.response_ids = list(range(5000))
        with pytest.raises(WriteFailed, match="rollout dump could not be written to .*: no space left on device"):
            dump.write(big)
        assert _keys(root / "rollouts.jsonl") == [(0, 0, 0)]
