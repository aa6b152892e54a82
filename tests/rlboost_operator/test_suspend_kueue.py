"""Suspending and queueing an RLJob, end to end through the operator against kmock (issue 30).

- spec.suspend: the operator asks the trainer over the job's real NATS to checkpoint, and scales nothing while the
  trainer answers "not yet"; once it answers that a checkpoint holds every step, every child goes to zero and the
  phase is Suspended; suspend: false brings every child back (Pending, "resumed from the checkpoint after step N").
  The trainer here is a stand-in that answers the requests (the real one is tested in tests/trainer/ and the cluster
  lane): where the stand-in begins is the NATS subscription on the `suspend` subject.
- Kueue: these tests play Kueue's part, because Kueue's controller (a Go program that needs a real API server and
  its admission webhooks) cannot run against kmock. Where Kueue would admit the Workload, the test writes what
  Kueue's scheduler writes (status.admission with a ResourceFlavor per podSet, QuotaReserved and Admitted True);
  where Kueue would preempt it, the test sets Evicted=True (reason Preempted) as Kueue's preemptor does. Everything
  from the Workload's creation to the job's reaction (holding it, placing it on the flavor's nodes, suspending it,
  giving the quota back) is the operator's real code.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterator
from typing import Any

import kmock
import nats
import pytest

from rlboost.wire.events import SUSPEND, SuspendReply
from tests.helpers import wait_until
from tests.rlboost_operator.conftest import VERBS, KubeApi
from tests.rlboost_operator.test_operator import NS, rljob, status_of

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_RESOURCES = {
    "kueue.x-k8s.io/v1beta2/workloads": dict(kind="Workload", namespaced=True, subresources={"status"}),
    "kueue.x-k8s.io/v1beta2/resourceflavors": dict(kind="ResourceFlavor", namespaced=False),
    "kueue.x-k8s.io/v1beta2/workloadpriorityclasses": dict(kind="WorkloadPriorityClass", namespaced=False),
}
WORKLOADS = ("Deployment", "StatefulSet")


def replicas(api: KubeApi, job: str) -> dict[str, int]:
    """Every workload of the job and its replicas."""
    out = {}
    for kind in WORKLOADS:
        for obj in api.list(kind, NS):
            if obj["metadata"].get("labels", {}).get("rlboost.io/job") == job:
                out[obj["metadata"]["name"]] = obj["spec"]["replicas"]
    return out


class StandInTrainer:
    """Answers the job's suspend requests as the trainer does (trainer/suspension.py): not yet, until `checkpoint()`
    is called, then checkpointed after `steps` steps. Runs its own loop in a thread."""

    def __init__(self, job_nats: Any, job: str, steps: int) -> None:
        self.job_nats, self.job, self.steps = job_nats, job, steps
        self.asked = 0
        self.ready, self.done, self.stop = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> StandInTrainer:
        self.thread.start()
        assert self.ready.wait(10), "the stand-in trainer did not subscribe"
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def checkpoint(self) -> None:
        self.done.set()

    async def _serve(self) -> None:
        nc = await nats.connect(self.job_nats.url, **self.job_nats.options("trainer"))

        async def on_request(msg: Any) -> None:
            self.asked += 1
            reply = SuspendReply(checkpointed=self.done.is_set(), steps_done=self.steps, weights_checksum="w")
            await msg.respond(reply.model_dump_json().encode())

        await nc.subscribe(SUSPEND.subject(NS, self.job), cb=on_request)
        await nc.flush()
        self.ready.set()
        while not self.stop.is_set():
            await asyncio.sleep(0.02)  # polling a thread flag inside the stand-in, not test synchronisation
        await nc.close()


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return {c["type"]: c for c in st.get("conditions") or []}.get(kind, {})


def test_spec_suspend_waits_for_the_trainers_checkpoint_then_scales_every_child_to_zero(operator, job_nats):
    api = operator
    api.create("RLJob", rljob("pause", {"rollout": {"spot": {"minReplicas": 1, "maxReplicas": 2}}}))
    wait_until(lambda: status_of(api, "pause").get("phase") == "Pending", timeout=60, what="phase Pending")
    running = replicas(api, "pause")
    assert running["pause-trainer"] == 1 and running["pause-workers-spot"] == 1
    job_nats.start(api, NS, "pause")
    with StandInTrainer(job_nats, "pause", steps=7) as trainer:
        api.patch("RLJob", NS, "pause", {"spec": {"suspend": True}})
        wait_until(lambda: trainer.asked >= 3, timeout=60, what="the operator asking the trainer three times")
        suspending = lambda: (status_of(api, "pause").get("suspension") or {}).get("state") == "Suspending"  # noqa: E731
        wait_until(suspending, timeout=60, what="status.suspension.state Suspending")
        assert condition(status_of(api, "pause"), "Suspended")["reason"] == "Suspending"
        asked = trainer.asked
        wait_until(lambda: trainer.asked >= asked + 2, timeout=60, what="two more requests")
        assert replicas(api, "pause") == running, "scaled before the trainer checkpointed"
        trainer.checkpoint()
        wait_until(lambda: status_of(api, "pause").get("phase") == "Suspended", timeout=60, what="Suspended")
    assert set(replicas(api, "pause").values()) == {0}
    st = status_of(api, "pause")
    assert st["suspension"]["checkpointedSteps"] == 7 and st["suspension"]["reason"] == "Suspended"
    assert condition(st, "Suspended")["status"] == "True" and st["costPerHour"] == 0.0
    # the Event is posted by kopf's background poster after the status: waited for, not read once
    events = wait_until(lambda: suspended_events(api, "pause"), timeout=20, what="the Suspended Event")
    assert "after step 7 (checkpointed)" in events[0]["message"]
    api.patch("RLJob", NS, "pause", {"spec": {"suspend": False}})
    wait_until(lambda: status_of(api, "pause").get("phase") == "Pending", timeout=60, what="resumed")
    wait_until(lambda: replicas(api, "pause") == running, timeout=60, what="every child back")
    resumed = condition(status_of(api, "pause"), "Suspended")
    assert resumed["status"] == "False" and "after step 7" in resumed["message"]


def test_a_suspension_with_no_trainer_answering_stops_after_the_grace(operator, job_nats, monkeypatch):
    """A job whose trainer does not run (here: nobody subscribed) has nothing unsaved: it stops once no trainer
    answered for the grace period (shortened here)."""
    from rlboost_operator import suspension

    monkeypatch.setattr(suspension, "NO_TRAINER_GRACE_S", 1.0)
    api = operator
    api.create("RLJob", rljob("idle", {"suspend": True}))  # suspended from the start: no pod ever runs
    wait_until(lambda: status_of(api, "idle").get("phase") == "Suspended", timeout=60, what="Suspended at once")
    assert set(replicas(api, "idle").values()) == {0}
    assert status_of(api, "idle")["suspension"].get("checkpointedSteps") is None  # none ran: none to wait for
    api.create("RLJob", rljob("gone"))
    wait_until(lambda: status_of(api, "gone").get("phase") == "Pending", timeout=60, what="phase Pending")
    job_nats.start(api, NS, "gone")
    api.patch("RLJob", NS, "gone", {"spec": {"suspend": True}})
    wait_until(lambda: status_of(api, "gone").get("phase") == "Suspended", timeout=60, what="Suspended")
    assert set(replicas(api, "gone").values()) == {0}
    events = wait_until(lambda: suspended_events(api, "gone"), timeout=20, what="the Suspended Event")
    assert "without a confirmed checkpoint" in events[0]["message"]


def suspended_events(api, job: str) -> list[dict]:
    """The job's Suspended Events (kopf posts them in the background, after the status is written)."""
    return [e for e in api.list("Event", NS) if e["involvedObject"]["name"] == job and e.get("reason") == "Suspended"]


# --- Kueue -------------------------------------------------------------------------------------------------


@pytest.fixture
def kueue_operator(kube_api: KubeApi, job_nats, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    """The operator with its Kueue integration on, and kmock serving Kueue's three resources."""
    from kopf.testing import KopfRunner

    for key, info in KUEUE_RESOURCES.items():
        kube_api.emulator.resources[key] = kmock.ResourceInfo(verbs=VERBS, **info)
    monkeypatch.setenv("RLBOOST_OPERATOR_KUEUE", "true")
    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", job_nats.url)
    importlib.import_module("rlboost_operator.kueue_watch")  # what handlers.py imports with the setting on
    flavor = {"nodeLabels": {"cloud.google.com/gke-nodepool": "h100"}, "tolerations": [GPU_TOLERATION]}
    kube_api.http.post(f"{KUEUE}/resourceflavors", json=cluster_object("ResourceFlavor", "h100", spec=flavor))
    kube_api.http.post(
        f"{KUEUE}/workloadpriorityclasses", json={**cluster_object("WorkloadPriorityClass", "high"), "value": 1000}
    )
    args = ["run", "-A", "--standalone", "-m", "rlboost_operator.handlers"]
    with KopfRunner(args, timeout=30) as runner:
        for plural in ("rljobs", "workloads"):
            wait_until(lambda p=plural: kube_api.watched(p), timeout=60, what=f"the operator's watch on {plural}")
        yield kube_api
    assert runner.exception is None, runner.output


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
QUEUED = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"}


def cluster_object(kind: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": {"name": name}, **fields}


def workload(api: KubeApi, job: str) -> dict[str, Any] | None:
    name = (status_of(api, job).get("kueue") or {}).get("workload")
    return api.get("Workload", NS, name) if name else None


def kueue_admits(api: KubeApi, wl: dict[str, Any]) -> None:
    """What Kueue's scheduler writes when it admits a Workload (the stand-in for Kueue begins here)."""
    assignments = [{"name": p["name"], "flavors": {"cpu": "h100"}, "count": p["count"]} for p in wl["spec"]["podSets"]]
    conditions = [
        {
            "type": "QuotaReserved",
            "status": "True",
            "reason": "QuotaReserved",
            "message": "Quota reserved in ClusterQueue cq",
        },
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "The workload is admitted"},
    ]
    if any(c["type"] == "Evicted" for c in (wl.get("status") or {}).get("conditions") or []):
        conditions.append({"type": "Evicted", "status": "False", "reason": "QuotaReserved", "message": "readmitted"})
    status = {"admission": {"clusterQueue": "cq", "podSetAssignments": assignments}, "conditions": conditions}
    api.http.patch(
        f"{KUEUE}/namespaces/{NS}/workloads/{wl['metadata']['name']}/status",
        json={"status": status},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def kueue_preempts(api: KubeApi, wl: dict[str, Any]) -> None:
    """What Kueue's preemptor writes on the Workload it evicts (the stand-in for Kueue)."""
    evicted = {
        "type": "Evicted",
        "status": "True",
        "reason": "Preempted",
        "message": "Preempted to accommodate a higher priority Workload",
    }
    conditions = [*wl["status"]["conditions"], evicted]
    api.http.patch(
        f"{KUEUE}/namespaces/{NS}/workloads/{wl['metadata']['name']}/status",
        json={"status": {"conditions": conditions}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def test_a_queued_job_waits_runs_once_admitted_and_a_preemption_suspends_it_until_readmitted(
    kueue_operator, monkeypatch
):
    from rlboost_operator import suspension

    monkeypatch.setattr(suspension, "NO_TRAINER_GRACE_S", 1.0)  # no trainer runs here: stop after 1 s, not 20
    api = kueue_operator
    job = rljob("queued", {"trainer": {"ranks": 2}, "rollout": {"spot": {"minReplicas": 1, "maxReplicas": 2}}})
    job["metadata"]["labels"] = QUEUED
    api.create("RLJob", job)
    # Waiting in its queue: every child exists at zero replicas, so it holds no accelerator.
    wait_until(lambda: status_of(api, "queued").get("phase") == "Suspended", timeout=60, what="held")
    wait_until(lambda: workload(api, "queued") is not None, timeout=60, what="the Workload")
    assert set(replicas(api, "queued").values()) == {0}
    st = status_of(api, "queued")
    assert st["suspension"]["reason"] == "WaitingForAdmission" and "LocalQueue team-a" in st["suspension"]["message"]
    wl = workload(api, "queued")
    assert wl["spec"]["queueName"] == "team-a" and wl["spec"]["priority"] == 1000
    assert {p["name"]: p["count"] for p in wl["spec"]["podSets"]}["trainer"] == 2  # the ranks together
    assert "spot-workers" not in {p["name"] for p in wl["spec"]["podSets"]}
    assert wl["metadata"]["ownerReferences"][0]["name"] == "queued"
    # Kueue admits it: everything runs, the gang on the flavor's nodes.
    kueue_admits(api, wl)
    expected = {"queued-trainer": 2, "queued-manager": 1, "queued-workers-spot": 1}
    wait_until(lambda: expected.items() <= replicas(api, "queued").items(), timeout=60, what="every child running")
    running = replicas(api, "queued")
    trainer = api.get("StatefulSet", NS, "queued-trainer")["spec"]["template"]
    assert trainer["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "h100"}
    assert trainer["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    spot = api.get("Deployment", NS, "queued-workers-spot")
    assert spot["metadata"]["ownerReferences"][0]["controller"] is False  # Kueue admits each spot pod itself
    wait_until(lambda: status_of(api, "queued").get("phase") == "Pending", timeout=60, what="resumed")
    assert status_of(api, "queued")["kueue"]["admitted"] is True
    # Kueue preempts it: no trainer answers here, so it stops after the grace; then the quota goes back.
    kueue_preempts(api, workload(api, "queued"))
    wait_until(lambda: status_of(api, "queued").get("phase") == "Suspended", timeout=60, what="suspended")
    assert set(replicas(api, "queued").values()) == {0}
    wait_until(lambda: workload(api, "queued").get("status", {}).get("admission") is None, timeout=60, what="released")
    released = condition(workload(api, "queued")["status"], "QuotaReserved")
    assert (
        released["status"] == "False" and condition(workload(api, "queued")["status"], "Requeued")["status"] == "True"
    )
    # Kueue admits it again later: it resumes.
    kueue_admits(api, workload(api, "queued"))
    wait_until(lambda: replicas(api, "queued") == running, timeout=60, what="running again")
    wait_until(lambda: status_of(api, "queued").get("phase") == "Pending", timeout=60, what="resumed again")
