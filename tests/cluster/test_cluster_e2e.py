"""The cluster lane end to end: RLJob manifests through kmock, the operator's image and podman pods.

Runs scripts/cluster_e2e.py (which builds missing images with `make images`) three times and checks its summaries:
- examples/rljob.yaml unchanged: Succeeded, every pod Ready with no restart, rewards reported, no sample lost, and
  every panel of the Grafana dashboard drew data while the job ran;
- the same with `--chaos`: a spot pod deleted (kubectl delete pod), the trainer's container SIGKILLed, a spot node
  tainted with GKE's termination taint and then deleted: Succeeded, no sample lost, the drain notice reached the
  manager, and the final weights checksum equals the uninterrupted run's (the trainer resumed bit-exactly from
  its PVC's checkpoint);
- the same manifest with an impossible model source (an s3:// bucket no credentials reach): Failed with a
  condition naming spec.model.uri, scaled to zero, instead of a fetch-model init container crash-looping;
- the same job carrying the label kueue.x-k8s.io/queue-name, with `--kueue` (the operator's Kueue integration on):
  it waits for admission with no pod, runs once admitted, is paused mid-run with spec.suspend and resumed, then
  preempted by Kueue and admitted again, and reaches Succeeded on the uninterrupted run's final checksum. Kueue's
  own part (admitting and preempting the Workload the operator made) is played by the lane, because Kueue's
  controller cannot run against kmock: scripts/cluster/kueue_standin.py says exactly where that begins.
Marked `cluster` (minutes, root and podman needed); `make test-cluster` runs it (CI's lane). The Kubernetes API is
kmock and the kubelet the podlet, because no real API server or kubelet can run on these machines (see
scripts/cluster/podlet.py for what they do and do not emulate); every pod and service is a real container from
the built images.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "rljob.yaml"
# Seconds per lane run (set-up, the job, tear-down); together under make test-cluster's 30 minutes.
PLAIN_S, CHAOS_S, BAD_MODEL_S, KUEUE_S = 720, 720, 300, 1200
LANE_RESERVE_S = 150  # of each run's time: network, NATS, the API, the operator's image, tear-down
BAD_URI = "s3://rlboost-lane-no-such-bucket/models/tiny"
SUMMARIES = ROOT / "build" / "cluster"  # each run's summary, kept for a look (and docs/benchmarks.md)


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


def run_lane(out: Path, *flags: str, timeout: int, rljob: Path = EXAMPLE) -> dict:
    """scripts/cluster_e2e.py on `rljob`; its summary (the lane's own output says where it stopped)."""
    out.unlink(missing_ok=True)  # an earlier run's summary must not pass for this one's
    cmd = [sys.executable, "scripts/cluster_e2e.py", "--rljob", str(rljob), "--json", str(out), *flags]
    proc = subprocess.run([*cmd, "--timeout", str(timeout - LANE_RESERVE_S)], cwd=ROOT, timeout=timeout)
    assert out.exists(), f"the lane wrote no summary (exit {proc.returncode}); its output above says where it stopped"
    return json.loads(out.read_text())


def where(summary: dict) -> str:
    keys = ("phase", "stopped_because", "steps", "pods", "conditions", "dashboard_panels_empty", "notes", "chaos")
    return json.dumps({k: summary.get(k) for k in keys}, indent=1)


@pytest.fixture(scope="module")
def plain() -> dict:
    """examples/rljob.yaml run once, uninterrupted: its own checks and the chaos run's reference checksum."""
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    return run_lane(SUMMARIES / "plain.json", timeout=PLAIN_S)


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + 60)
def test_example_rljob_reaches_succeeded_in_real_containers(plain: dict) -> None:
    summary = plain
    assert summary["phase"] == "Succeeded", f"the job did not succeed:\n{where(summary)}"
    assert summary["pods"], "no pod ran"
    not_ready = {n: p for n, p in summary["pods"].items() if not p["ready"]}
    assert not not_ready, f"pods not Ready at the end: {not_ready}"
    restarted = {n: p["restarts"] for n, p in summary["pods"].items() if p["restarts"]}
    assert not restarted, f"pods restarted: {restarted}"
    assert not summary["restarts_during_run"], f"pods restarted during the run: {summary['restarts_during_run']}"
    assert summary["samples_lost"] == 0
    assert summary["reward_first"] is not None and summary["reward_last"] is not None, "no reward was reported"
    assert summary["final_weights_checksum"], "the trainer reported no final weights checksum"
    check = json.dumps(summary.get("dashboard_check"))
    assert summary["dashboard_panels_empty"] == [], f"dashboard panels without data while the job ran: {check}"


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + CHAOS_S + 60)
def test_faults_lose_no_sample_and_end_on_the_uninterrupted_checksum(plain: dict) -> None:
    chaos = run_lane(SUMMARIES / "chaos.json", "--chaos", timeout=CHAOS_S)
    assert chaos["phase"] == "Succeeded", f"the faulted job did not succeed:\n{where(chaos)}"
    assert len(chaos["chaos"]) >= 3, chaos["chaos"]  # pod deleted, trainer killed, node tainted (then deleted)
    assert chaos["samples_lost"] == 0
    assert (chaos["preemption_notices"] or 0) >= 1, "the spot node's drain notice never reached the manager"
    assert plain["final_weights_checksum"], "the uninterrupted run gave no checksum to compare with"
    assert chaos["final_weights_checksum"] == plain["final_weights_checksum"]


@pytest.mark.cluster
@pytest.mark.timeout(BAD_MODEL_S + 60)
def test_an_impossible_model_source_fails_the_rljob_naming_spec_model(tmp_path: Path) -> None:
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = "bad-model"
    job["spec"]["model"] = {"source": "uri", "uri": BAD_URI}
    manifest = tmp_path / "bad-model.yaml"
    manifest.write_text(yaml.safe_dump(job))
    summary = run_lane(SUMMARIES / "bad-model.json", timeout=BAD_MODEL_S, rljob=manifest)
    assert summary["phase"] == "Failed", f"the job did not fail:\n{where(summary)}"
    conditions = {c["type"]: c for c in summary["conditions"] or []}
    model = conditions.get("ModelReady") or {}
    assert model.get("status") == "False" and model["message"].startswith("spec.model.uri: "), where(summary)
    assert BAD_URI in model["message"], model
    assert conditions["Failed"]["reason"] == "ModelUnavailable"
    assert conditions["Stopped"]["status"] == "True", "the job was not scaled to zero"


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + KUEUE_S + 60)
def test_a_queued_job_paused_and_preempted_mid_run_ends_on_the_uninterrupted_checksum(
    plain: dict, tmp_path: Path
) -> None:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "lane-queue", "team": "rl"}
    manifest = tmp_path / "queued.yaml"
    manifest.write_text(yaml.safe_dump(job))
    summary = run_lane(SUMMARIES / "kueue.json", "--kueue", timeout=KUEUE_S, rljob=manifest)
    kueue = summary["kueue"]
    assert summary["phase"] == "Succeeded", f"the queued job did not succeed:\n{where(summary)}\n{json.dumps(kueue)}"
    assert kueue["stage"] == "done", kueue  # every step of the scenario happened
    assert kueue["held_without_pods"], "the job did not wait for admission without pods"
    paused, preempted = kueue["suspensions"]
    assert paused["reason"] == "Suspended" and "Kueue evicted" in preempted["event"], kueue["suspensions"]
    for suspension in (paused, preempted):
        assert set(suspension["replicas"].values()) == {0}, suspension  # every child scaled to zero
        assert suspension["checkpointedSteps"], suspension  # the trainer checkpointed at a step boundary first
        assert "(checkpointed)" in (suspension["event"] or ""), suspension
    assert kueue["quota_released"], "the evicted Workload's quota was not given back"
    assert summary["samples_lost"] == 0
    assert summary["final_weights_checksum"] == plain["final_weights_checksum"]
