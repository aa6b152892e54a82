"""The cluster lane's faults (`make test-cluster-chaos`; not in `make test-cluster`, which runs the plain job):
examples/rljob.yaml run once uninterrupted and once with `--chaos` — a spot pod deleted (kubectl delete pod), the
trainer's container SIGKILLed, a spot node tainted with GKE's termination taint and then deleted. The faulted run
must succeed with no sample lost and end on the uninterrupted run's final weights checksum (the trainer resumed
bit-exactly from its PVC's checkpoint). Same stand-ins as test_cluster_e2e.py: kmock and the podlet.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.test_cluster_e2e import LANE_TIMEOUT_S, ROOT, podman_problem


def lane(out: Path, *flags: str) -> dict:
    cmd = [sys.executable, "scripts/cluster_e2e.py", "--rljob", "examples/rljob.yaml", "--json", str(out), *flags]
    proc = subprocess.run([*cmd, "--timeout", str(LANE_TIMEOUT_S // 2 - 300)], cwd=ROOT, timeout=LANE_TIMEOUT_S // 2)
    assert out.exists(), f"the lane wrote no summary (exit {proc.returncode}); its output above says where it stopped"
    return json.loads(out.read_text())


@pytest.mark.cluster
@pytest.mark.timeout(LANE_TIMEOUT_S + 120)
def test_faults_lose_no_sample_and_end_on_the_uninterrupted_checksum(tmp_path: Path) -> None:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    plain = lane(tmp_path / "plain.json")
    chaos = lane(tmp_path / "chaos.json", "--chaos")
    assert plain["phase"] == chaos["phase"] == "Succeeded", json.dumps(chaos.get("stopped_because"))
    assert len(chaos["chaos"]) >= 3, chaos["chaos"]  # pod deleted, trainer killed, node tainted (then deleted)
    assert chaos["samples_lost"] == 0
    assert chaos["final_weights_checksum"] == plain["final_weights_checksum"]
