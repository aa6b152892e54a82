"""End to end: `rlboost local --steps 2` with every real service as a separate process on 127.0.0.1.

Checks: exit 0; the report has 2 steps; trajectories reached the trainer (tokens > 0); every worker
ends on the final weight version; no process of the run is left alive. Run it alone with
`.venv/bin/pytest -m slow tests/e2e/test_local_e2e.py`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]

# Small but real: a tiny model, few prompts, short responses, so two steps fit in a few minutes on 2 cores.
CONFIG = """
model: {hiddenSize: 64, numLayers: 2, numHeads: 2, warmupSteps: 5}
task: {numPrompts: 32}
algorithm: {promptsPerStep: 4, groupSize: 4, maxNewTokens: 6, microBatchSize: 16}
rollout:
  reserved: {replicas: 1, capacity: 16}
  spot: {replicas: 2, capacity: 16}
"""


def _live_processes_mentioning(text: str) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state not in ("Z", "X"):
            out.append(f"{proc.name}: {cmd[:200]}")
    return out


@pytest.mark.slow
def test_rlboost_local_two_steps(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG)
    run_dir, report_path = tmp_path / "run", tmp_path / "report.json"
    run_local("--config", cfg, "--steps", "2", "--run-dir", run_dir, "--json-report", report_path)
    report = json.loads(report_path.read_text())
    steps = report["steps"]
    assert [s["step"] for s in steps] == sorted(s["step"] for s in steps) and len(steps) == 2
    assert all(s["tokens"] > 0 for s in steps), "the trainer received no trajectories"
    final = steps[-1]["weight_version"]
    assert steps[0]["weight_version"] < final
    assert report["workers"], "the manager reported no workers"
    assert {w["worker_id"]: w["weight_version"] for w in report["workers"]} == {
        w["worker_id"]: final for w in report["workers"]
    }
    assert report["final_weights_checksum"]
    assert _live_processes_mentioning(str(run_dir)) == []
