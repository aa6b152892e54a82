"""The cluster lane end to end: RLJob manifests through kmock, the operator's image and podman pods.

Runs scripts/cluster_e2e.py (which builds missing images with `make images`) four times and checks its summaries.
Every run has the operator as the chart deploys it by default: its Deployment rendered by real Helm, 2 replicas
electing a leader on a Lease (scripts/cluster/operator_lane.py), and the chart's CRD. The three runs whose
checksums are compared run the examples' job with `steps` at LANE_STEPS (lane_manifest), so that the faults and the
Kueue scenario, scheduled by step, land while it runs.
- examples/rljob-platform.yaml with `--platform` (issue 29): the job of examples/rljob.yaml as a platform team's
  cluster runs it: every node tainted team=ml:NoSchedule, a PriorityClass, the Secrets it names. Succeeded, every
  pod Ready with no restart, rewards reported, no sample lost, every panel of the Grafana dashboard drew data while
  the job ran; and each pod got what the spec says: its own ServiceAccount with the annotations given (identity),
  env from the Secret, the toleration (else it would have stayed Pending), a 256 MiB /dev/shm where the overlay
  asks for it (read inside the container), the priority class (the podlet admits a pod only when its class
  exists) and, for the trainer, manager and weight-server, do-not-disrupt annotations and a PodDisruptionBudget;
- examples/rljob.yaml with `--chaos`: a spot pod deleted (kubectl delete pod), the leader operator replica SIGKILLed
  (a replica leads again), the trainer's container SIGKILLed, a spot node tainted with GKE's termination taint and
  then deleted: Succeeded, no sample lost, the drain notice reached the manager, a replica leads again under a new identity,
  and the final weights checksum equals the platform run's (the trainer resumed bit-exactly from its PVC's
  checkpoint; the pod policy changes nothing of what is trained);
- the same manifest with an impossible model source (an s3:// bucket no credentials reach): Failed with a
  condition naming spec.model.uri, scaled to zero, instead of a fetch-model init container crash-looping;
- the same job carrying the label kueue.x-k8s.io/queue-name, with `--kueue` (the operator's Kueue integration on):
  it waits for admission with no pod, runs once admitted, is paused mid-run with spec.suspend and resumed, then
  preempted by Kueue and admitted again, and reaches Succeeded on the uninterrupted run's final checksum. Kueue's
  own part (admitting and preempting the Workload the operator made) is played by the lane, because Kueue's
  controller cannot run against kmock: scripts/cluster/kueue_standin.py says exactly where that begins.
Marked `cluster` (minutes, root and podman needed); `make test-cluster` runs it (CI's lane). The Kubernetes API is
kmock (scripts/cluster/kube_api.py) and the kubelet the podlet (scripts/cluster/podlet.py), because no real API
server or kubelet can run on these machines (their docstrings say what they do and do not emulate: no admission but
the podlet's PriorityClass check, no image pulls, no PodDisruptionBudget enforcement, no cloud identity webhook: the
accounts' annotations are checked, not used); every pod and service is a real container from the built images.
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
PLATFORM = ROOT / "examples" / "rljob-platform.yaml"
SHM_BYTES = 256 << 20  # the platform example's /dev/shm (trainer, reserved workers)
PROTECTED = ("-trainer-", "-manager-", "-weights-")  # pods with a budget and do-not-disrupt
# Seconds per lane run (set-up, the job, tear-down); together under make test-cluster's 30 minutes.
PLAIN_S, CHAOS_S, BAD_MODEL_S, KUEUE_S = 750, 750, 300, 1200
LANE_STEPS = 120  # the examples' 40 steps, three times over (see lane_manifest)
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


def lane_manifest(src: Path, name: str, labels: dict[str, str] | None = None) -> Path:
    """`src` with LANE_STEPS steps (and `labels`), written under SUMMARIES: every run the checksums are compared
    across runs the same job, long enough that the chaos and the Kueue scenario act while it runs (at the example's
    40 steps the job now finishes in ~20 s, before the faults the lane schedules by step)."""
    job = yaml.safe_load(src.read_text())
    job["spec"]["algorithm"]["steps"] = LANE_STEPS
    if labels:
        job["metadata"]["labels"] = labels
    SUMMARIES.mkdir(parents=True, exist_ok=True)
    out = SUMMARIES / name
    out.write_text(yaml.safe_dump(job))
    return out


def where(summary: dict) -> str:
    keys = (
        "phase",
        "stopped_because",
        "steps",
        "pods",
        "conditions",
        "dashboard_panels_empty",
        "notes",
        "chaos",
        "operator",
    )
    return json.dumps({k: summary.get(k) for k in keys}, indent=1)


@pytest.fixture(scope="module")
def plain() -> dict:
    """examples/rljob-platform.yaml on a platform team's cluster, uninterrupted: its own checks and the chaos run's
    reference checksum."""
    problem = podman_problem()
    if problem:
        pytest.skip(problem)
    manifest = lane_manifest(PLATFORM, "platform.yaml")
    return run_lane(SUMMARIES / "plain.json", "--platform", timeout=PLAIN_S, rljob=manifest)


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + 60)
def test_a_platform_teams_rljob_reaches_succeeded_in_real_containers(plain: dict) -> None:
    summary = plain
    assert summary["phase"] == "Succeeded", f"the job did not succeed:\n{where(summary)}"
    assert summary["pods"], "no pod ran"
    not_ready = {n: p for n, p in summary["pods"].items() if not p["ready"] and not p.get("finished")}
    assert not not_ready, f"pods not Ready at the end: {not_ready}"
    restarted = {n: p["restarts"] for n, p in summary["pods"].items() if p["restarts"]}
    assert not restarted, f"pods restarted: {restarted}"
    assert not summary["restarts_during_run"], f"pods restarted during the run: {summary['restarts_during_run']}"
    assert summary["samples_lost"] == 0
    assert summary["reward_first"] is not None and summary["reward_last"] is not None, "no reward was reported"
    assert summary["final_weights_checksum"], "the trainer reported no final weights checksum"
    check = json.dumps(summary.get("dashboard_check"))
    assert summary["dashboard_panels_empty"] == [], f"dashboard panels without data while the job ran: {check}"
    assert summary["operator"]["replicas"] == 2 and summary["operator"]["leader_first"], summary["operator"]


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + 60)
def test_each_pod_got_its_components_identity_env_shm_priority_and_protection(plain: dict) -> None:
    seen = plain["platform"]
    assert seen, f"the lane observed no pod while the job ran:\n{where(plain)}"
    unread = {n: p["error"] for n, p in seen.items() if "error" in p}
    assert not unread, f"pods the lane could not read inside: {unread}"
    job = "addition-platform"
    by_prefix = lambda prefix: {n: p for n, p in seen.items() if n.startswith(f"{job}-{prefix}")}  # noqa: E731
    components = ("trainer", "manager", "weights", "nats", "workers-reserved", "workers-spot")
    assert all(by_prefix(c) for c in components[:5]), sorted(seen)
    accounts = {"weights": "weight-server", "workers-reserved": "reserved-worker", "workers-spot": "spot-worker"}
    roles = {"trainer": "rlboost-trainer", "workers-reserved": "rlboost-models"}
    for component in components:
        for name, pod in by_prefix(component).items():
            assert pod["service_account"] == f"{job}-{accounts.get(component, component)}", name
            role = pod["account_annotations"].get("eks.amazonaws.com/role-arn", "")
            assert role.endswith(f"role/{roles[component]}") if component in roles else not role, (name, role)
            assert {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in pod["tolerations"]
            assert (
                pod["shm_bytes"] == SHM_BYTES
                if component in ("trainer", "workers-reserved")
                else pod["shm_bytes"] < SHM_BYTES
            ), (name, pod)
            protected = any(p in f"{name}-" for p in PROTECTED)
            assert (pod["annotations"].get("karpenter.sh/do-not-disrupt") == "true") is protected, name
            priority = component in ("trainer", "manager", "weights")
            assert (pod["priority_class"], pod["priority"]) == (
                ("rlboost-training", 100000) if priority else (None, None)
            ), name
    assert all(p["wandb_mode"] == "offline" for p in by_prefix("trainer").values())  # envFrom the Secret `tracking`
    assert all(p["wandb_mode"] is None for p in by_prefix("manager").values())
    assert plain["disruption_budgets"] == [f"{job}-manager", f"{job}-trainer", f"{job}-weights"]


@pytest.mark.cluster
@pytest.mark.timeout(PLAIN_S + CHAOS_S + 60)
def test_faults_lose_no_sample_and_end_on_the_uninterrupted_checksum(plain: dict) -> None:
    chaos = run_lane(SUMMARIES / "chaos.json", "--chaos", timeout=CHAOS_S, rljob=lane_manifest(EXAMPLE, "chaos.yaml"))
    assert chaos["phase"] == "Succeeded", f"the faulted job did not succeed:\n{where(chaos)}"
    assert len(chaos["chaos"]) >= 4, chaos["chaos"]  # pod deleted, leader and trainer killed, node tainted (deleted)
    operator = chaos["operator"]
    assert len(operator["killed"]) == 1, operator  # the leader, mid-job
    # a replica leads again under a new identity: the standby, or the killed one restarted by its pod (both race for
    # the expired Lease, as on a cluster; the lane saw each win)
    assert operator["successor"], operator
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
def test_a_queued_job_paused_and_preempted_mid_run_ends_on_the_uninterrupted_checksum(plain: dict) -> None:
    labels = {"kueue.x-k8s.io/queue-name": "lane-queue", "team": "rl"}
    manifest = lane_manifest(EXAMPLE, "queued.yaml", labels)
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
