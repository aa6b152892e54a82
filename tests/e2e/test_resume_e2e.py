"""Bit-exact resume end to end: `rlboost local` with every real service as a separate process on 127.0.0.1.

Under greedy decoding (--temperature 0):
- `--steps 4` uninterrupted,
- `--steps 2` then `--steps 4 --resume` (same --checkpoint-dir and run directory: the weight-server still
  holds the checkpointed version, which the resumed trainer reuses),
- `--steps 4` SIGKILLed mid-step, runner and every service with it as when the machine dies (right after the step-2
  checkpoint is complete), then `--steps 4 --resume` (a trainer killed alone is restarted by the runner itself:
  tests/e2e/test_supervision_e2e.py),
all end with the same final_weights_checksum. Run it alone with
`.venv/bin/pytest -m slow tests/e2e/test_resume_e2e.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]

# The entropy bonus and KL penalty make every step change the weights even if a group's rewards tie.
CONFIG = """
model: {{path: {model}, hiddenSize: 64, numLayers: 2, numHeads: 2, warmupSteps: 5}}
task: {{numPrompts: 32}}
algorithm: {{promptsPerStep: 2, groupSize: 2, maxNewTokens: 4, microBatchSize: 4, entropyCoef: 0.05, klCoef: 0.05}}
trainer: {{checkpointEvery: 2}}
rollout:
  reserved: {{replicas: 1, capacity: 8}}
  spot: {{replicas: 0, capacity: 8}}
"""


def _cmd(cfg: Path, run_dir: Path, ckpt: Path, steps: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlboost.cli.main",
        "local",
        "--config",
        str(cfg),
        "--steps",
        str(steps),
        "--temperature",
        "0",
        "--run-dir",
        str(run_dir),
        "--checkpoint-dir",
        str(ckpt),
        "--json-report",
        str(run_dir.with_suffix(f".{steps}{''.join(extra)}.json")),
        *extra,
    ]


def _run(cfg: Path, run_dir: Path, ckpt: Path, steps: int, *extra: str) -> dict:
    res = subprocess.run(_cmd(cfg, run_dir, ckpt, steps, *extra), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return json.loads(run_dir.with_suffix(f".{steps}{''.join(extra)}.json").read_text())


def _trainer_pids(run_dir: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " -m trainer " in cmd and str(run_dir) in cmd:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_resume_is_bit_exact_also_after_sigkill(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG.format(model=tmp_path / "model"))

    straight = _run(cfg, tmp_path / "a", tmp_path / "ckpt-a", 4)
    assert straight["ok"] and len(straight["steps"]) == 4 and straight["final_weights_checksum"]
    # The entropy bonus moves the weights every step even when all rewards tie: the comparison is not vacuous.
    assert len({s["weights_checksum"] for s in straight["steps"]}) == 4

    _run(cfg, tmp_path / "b", tmp_path / "ckpt-b", 2)
    assert (tmp_path / "ckpt-b" / "step-00000002" / "manifest.json").is_file()
    resumed = _run(cfg, tmp_path / "b", tmp_path / "ckpt-b", 4, "--resume")
    assert [s["step"] for s in resumed["steps"]] == [2, 3]  # only the remaining steps ran
    assert resumed["final_weights_checksum"] == straight["final_weights_checksum"]

    run_c, ckpt_c = tmp_path / "c", tmp_path / "ckpt-c"
    proc = subprocess.Popen(_cmd(cfg, run_c, ckpt_c, 4), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: (ckpt_c / "step-00000002" / "manifest.json").is_file(), timeout=400)
        assert _trainer_pids(run_c), "trainer process not found"
        os.kill(proc.pid, signal.SIGKILL)  # mid-step 2: the runner, and every service with it (their PDEATHSIG)
        proc.communicate(timeout=120)
        wait_until(lambda: not _trainer_pids(run_c), timeout=60, what="the trainer gone with the runner")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (ckpt_c / "step-00000004").exists()
    after_kill = _run(cfg, run_c, ckpt_c, 4, "--resume")
    # The kill lands just after the step-2 checkpoint, maybe before step 1's report went out: the resumed trainer
    # then sends it again. The steps after the checkpoint are redone, and the weights end the same.
    assert [s["step"] for s in after_kill["steps"]][-2:] == [2, 3]
    assert after_kill["final_weights_checksum"] == straight["final_weights_checksum"]
