"""End to end: a full checkpoint disk (issue 31 item 2). The audit's run put the checkpoint directory on a 1 MiB
file system: the trainer failed with a torch zip error, left a 1 MiB .incoming/ behind, and resume redid steps it
had checkpointed.

Here `--checkpoint-dir` is a real tmpfs (tests/small_fs.py) that holds one checkpoint of this job and not two. The
job (4 steps, a checkpoint every 2) writes step 2's checkpoint, then fails at step 4's with one line naming the
directory and the fields to change; the runner does not restart a trainer that said why it failed; nothing is left
in .incoming/. With the checkpoints moved to a larger disk, `--resume` continues from the last complete one (step 2)
and ends with the weights an uninterrupted run ends with.

Run it alone with `.venv/bin/pytest -m slow tests/e2e/test_full_disk_e2e.py` (about 4 minutes on 2 busy cores).
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.e2e.test_resume_e2e import CONFIG, REPO, _cmd, _run
from tests.small_fs import mounted_tmpfs

# This job's checkpoint is about 1.6 MB (hiddenSize 64, 2 layers, fp32 master weights and Adam moments): a 2.5 MB
# file system holds the first and not the second (the test checks that the first one fits).
DISK = "2560k"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_full_checkpoint_disk_is_one_line_leaves_nothing_and_the_job_resumes_from_the_last_checkpoint(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG.format(model=tmp_path / "model"))
    straight = _run(cfg, tmp_path / "a", tmp_path / "ckpt-a", 4)

    run, ckpt = tmp_path / "b", tmp_path / "ckpt-b"
    with mounted_tmpfs(DISK) as small:
        res = subprocess.run(_cmd(cfg, run, small, 4), cwd=REPO, capture_output=True, text=True, timeout=900)
        assert res.returncode == 1, res.stdout[-3000:]
        failure = next(line for line in res.stdout.splitlines() if "rlboost local:" in line)
        assert "checkpoint step-00000004 could not be written to" in failure, res.stdout[-3000:]
        assert "no space left on device" in failure and "--checkpoint-dir" in failure
        assert "trainer.keepCheckpoints" in failure
        assert (small / "step-00000002" / "manifest.json").is_file()  # the first one fit: the test is not vacuous
        assert list((small / ".incoming").glob("step-*")) == []  # nothing partial left behind
        report = json.loads(run.with_suffix(".4.json").read_text())
        assert [s["step"] for s in report["steps"]] == [0, 1, 2] and report["restarts"] == []
        shutil.copytree(small, ckpt)  # a larger disk

    resumed = _run(cfg, run, ckpt, 4, "--resume")
    assert [s["step"] for s in resumed["steps"]] == [3]  # from the step-2 checkpoint: only step 3 was left
    assert resumed["final_weights_checksum"] == straight["final_weights_checksum"]
