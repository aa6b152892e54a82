"""The cluster lane's faults (`make test-cluster-chaos`; not in `make test-cluster`, which runs the plain job):
examples/rljob.yaml run once uninterrupted and once with `--chaos` — a spot pod deleted (kubectl delete pod), the
trainer's container SIGKILLed, a spot node tainted with GKE's termination taint and then deleted. The faulted run
must succeed with no sample lost and end on the uninterrupted run's final weights checksum (the trainer resumed
bit-exactly from its PVC's checkpoint). Same stand-ins as test_cluster_e2e.py: kmock and the podlet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cluster.test_cluster_e2e import LANE_TIMEOUT_S, podman_problem, run_lane


@pytest.mark.cluster
@pytest.mark.timeout(LANE_TIMEOUT_S + 120)
def test_faults_lose_no_sample_and_end_on_the_uninterrupted_checksum(tmp_path: Path) -> None:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    plain = run_lane(tmp_path / "plain.json", timeout=LANE_TIMEOUT_S // 2)
    chaos = run_lane(tmp_path / "chaos.json", "--chaos", timeout=LANE_TIMEOUT_S // 2)
    assert plain["phase"] == chaos["phase"] == "Succeeded", json.dumps(chaos.get("stopped_because"))
    assert len(chaos["chaos"]) >= 3, chaos["chaos"]  # pod deleted, trainer killed, node tainted (then deleted)
    assert chaos["samples_lost"] == 0
    assert chaos["final_weights_checksum"] == plain["final_weights_checksum"]
