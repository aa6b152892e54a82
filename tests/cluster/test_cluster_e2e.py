"""The cluster lane end to end: examples/rljob.yaml through kmock, the operator's image and podman pods.

Runs scripts/cluster_e2e.py (which builds missing images with `make images`) and checks its summary: the job
reaches Succeeded, every pod is Ready with no restart, and rewards were reported. Marked `cluster` (minutes,
root and podman needed); `make test-cluster` runs it. The Kubernetes API is kmock and the kubelet the podlet,
because no real API server or kubelet can run on these machines (see scripts/cluster/podlet.py for what
they do and do not emulate); every pod and service is a real container from the built images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LANE_TIMEOUT_S = 1700  # under make test-cluster's 30 minutes, with room for set-up and tear-down


def podman_problem() -> str | None:
    """Why podman cannot run the lane here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/cluster/setup.sh installs it as root)"
    if os.geteuid() != 0:
        return "the lane runs podman as root (bridged networks, static addresses); run as root"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=120)
    if info.returncode != 0:
        return f"podman is not usable: {info.stderr.strip()[-300:]}"
    return None


def run_lane(out: Path, *flags: str, timeout: int) -> dict:
    """scripts/cluster_e2e.py on examples/rljob.yaml; its summary (the lane's own output says where it stopped)."""
    cmd = [sys.executable, "scripts/cluster_e2e.py", "--rljob", "examples/rljob.yaml", "--json", str(out), *flags]
    proc = subprocess.run([*cmd, "--timeout", str(timeout - 300)], cwd=ROOT, timeout=timeout)
    assert out.exists(), f"the lane wrote no summary (exit {proc.returncode}); its output above says where it stopped"
    return json.loads(out.read_text())


@pytest.mark.cluster
@pytest.mark.timeout(LANE_TIMEOUT_S + 120)
def test_example_rljob_reaches_succeeded_in_real_containers(tmp_path: Path) -> None:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    summary = run_lane(tmp_path / "summary.json", timeout=LANE_TIMEOUT_S)
    keys = ("phase", "stopped_because", "steps", "pods", "conditions", "dashboard_panels_empty", "notes")
    where = json.dumps({k: summary.get(k) for k in keys}, indent=1)
    assert summary["phase"] == "Succeeded", f"the job did not succeed:\n{where}"
    assert summary["pods"], "no pod ran"
    not_ready = {n: p for n, p in summary["pods"].items() if not p["ready"]}
    assert not not_ready, f"pods not Ready at the end: {not_ready}"
    restarted = {n: p["restarts"] for n, p in summary["pods"].items() if p["restarts"]}
    assert not restarted, f"pods restarted: {restarted}"
    assert not summary["restarts_during_run"], f"pods restarted during the run: {summary['restarts_during_run']}"
    assert summary["samples_lost"] == 0
    assert summary["reward_first"] is not None and summary["reward_last"] is not None, "no reward was reported"
    assert summary["final_weights_checksum"], "the trainer reported no final weights checksum"
