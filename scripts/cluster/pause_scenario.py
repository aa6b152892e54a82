"""The lane's `--kueue` scenario: a job that carries a queue label waits for Kueue, runs, is paused by its owner
(spec.suspend) and later preempted by Kueue, and each time resumes where it stopped.

Driven one tick at a time by scripts/cluster_e2e.py's wait loop (no thread): each tick looks at the RLJob, its
Workload, the pods and the trainer's newest step report, and takes the next action once its condition holds:

1. queued: the RLJob names its Workload, its phase is Suspended (WaitingForAdmission) and no pod of it exists:
   the stand-in admits the Workload (kueue_standin.py: where Kueue's part begins);
2. running: the trainer reported step PAUSE_AT: the lane freezes the trainer's container (podman pause) and sets
   spec.suspend true, as a user would;
3. asking: the operator asks the trainer to checkpoint (its gauge rlboost_operator_job_suspending is 1): the
   trainer is thawed;
4. paused: phase Suspended and every pod gone: the suspension is recorded (reason, the steps the checkpoint holds,
   every workload's replicas, the operator's Event) and spec.suspend goes back to false;
5. resumed: the trainer reported AFTER_RESUME steps past the checkpoint: frozen again, and the stand-in preempts
   the Workload; 6. preempting: thawed once the operator asks the trainer;
7. preempted: phase Suspended, every pod gone and the quota given back by the operator: recorded, and the stand-in
   admits the Workload again; the job then runs to its end.

Why freeze the trainer: the example's steps take well under a second, the whole job half a minute, and the pause
must land mid-run however loaded the machine (the lane's poll and the operator's reaction took minutes on a machine
at load 25). Frozen, the trainer takes no step while the operator decides; its NATS subscription keeps the
operator's request (the operator asks on while a listening trainer is slow: suspension.py), and once thawed it
answers and checkpoints at the next step boundary. It is thawed as soon as the operator asks (not when the
operator's reconcile has written the status, which took over a minute on that machine: the kubelet's liveness
probe restarts a container frozen that long). Freezing changes no result: the final checksum is compared with
the uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from kueue_standin import KueueStandIn, admitted, quota_released

PAUSE_AT = 1  # the trainer's 0-based step after which the owner pauses the job
AFTER_RESUME = 1  # steps reported after a resume before Kueue preempts it
MERGE = {"Content-Type": "application/merge-patch+json"}


class PauseScenario:
    """The scenario's state: which stage it is at, and what it saw."""

    def __init__(
        self,
        http: httpx.Client,
        kueue: KueueStandIn,
        namespace: str,
        job: str,
        freeze: Callable[[str, bool], None],
        asking: Callable[[], bool],
    ) -> None:
        """`freeze(pod, frozen)`: pause or unpause that pod's container; `asking()`: whether the operator asks the
        job's trainer to checkpoint now (its gauge)."""
        self.http, self.kueue, self.namespace, self.job = http, kueue, namespace, job
        self.freeze, self.asking = freeze, asking
        self.stage = "queued"
        self.log: list[str] = []
        self.suspensions: list[dict[str, Any]] = []
        self.held_without_pods = False  # a poll saw it waiting for admission with no pod at all
        self.quota_released = False

    def _rljob_path(self) -> str:
        return f"/apis/rlboost.io/v1alpha1/namespaces/{self.namespace}/rljobs/{self.job}"

    def _suspend(self, value: bool) -> None:
        self.http.patch(self._rljob_path(), json={"spec": {"suspend": value}}, headers=MERGE).raise_for_status()

    def _workloads(self) -> dict[str, tuple[int, int]]:
        """Each workload of the job: (replicas asked for, pods the podlet runs for it: its status.replicas)."""
        out = {}
        for path in ("apps/v1/namespaces/{ns}/deployments", "apps/v1/namespaces/{ns}/statefulsets"):
            for obj in self.http.get("/apis/" + path.format(ns=self.namespace)).json()["items"]:
                if obj["metadata"].get("labels", {}).get("rlboost.io/job") == self.job:
                    running = int((obj.get("status") or {}).get("replicas") or 0)
                    out[obj["metadata"]["name"]] = (int(obj["spec"].get("replicas", 1)), running)
        return out

    def _replicas(self) -> dict[str, int]:
        return {name: asked for name, (asked, _) in self._workloads().items()}

    def _all_stopped(self) -> bool:
        """Every workload at zero, and none runs a pod any more (the podlet's status; a Pod object whose delete the
        API timed out on a loaded machine may linger after its container is gone)."""
        return all(asked == 0 and running == 0 for asked, running in self._workloads().values())

    def tick(self, step: int, status: dict[str, Any], pods: dict[str, Any]) -> str | None:
        """One look; returns what it did (for the lane's log), or None."""
        name = (status.get("kueue") or {}).get("workload")
        wl = self.kueue.workload(name) if name else None
        reason = (status.get("suspension") or {}).get("reason")
        held = status.get("phase") == "Suspended" and (not pods or self._all_stopped())
        if self.stage == "queued" and wl is not None and held and reason == "WaitingForAdmission":
            self.held_without_pods = True
            self.kueue.admit(wl)
            return self._next("running", f"Kueue (stand-in) admitted {name}; no pod existed while it waited")
        if self.stage == "running" and admitted(wl) and step >= PAUSE_AT:
            self.freeze(f"{self.job}-trainer-0", True)
            self._suspend(True)
            return self._next("asking", f"step {step}: trainer frozen; spec.suspend set to true (its owner pauses it)")
        if self.stage in ("asking", "preempting") and self.asking():
            self.freeze(f"{self.job}-trainer-0", False)
            after = "paused" if self.stage == "asking" else "preempted"
            return self._next(after, "the operator asks the trainer to checkpoint: trainer thawed")
        if self.stage == "paused" and held:
            self._record(status)
            self._suspend(False)
            return self._next("resumed", f"suspended ({reason}), every pod gone: spec.suspend back to false")
        if self.stage == "resumed" and self.suspensions and admitted(wl) and step >= self._resumed_at() + AFTER_RESUME:
            self.freeze(f"{self.job}-trainer-0", True)
            self.kueue.preempt(wl)
            return self._next("preempting", f"step {step}: trainer frozen; Kueue (stand-in) preempted {name}")
        if self.stage == "preempted" and held and quota_released(wl):
            self.quota_released = True
            self._record(status)
            self.kueue.admit(wl)
            return self._next("done", f"suspended ({reason}), quota given back: Kueue (stand-in) admitted {name} again")
        return None

    def _next(self, stage: str, what: str) -> str:
        self.stage = stage
        self.log.append(what)
        return what

    def _resumed_at(self) -> int:
        return int(self.suspensions[-1].get("checkpointedSteps") or 0)

    def _record(self, status: dict[str, Any]) -> None:
        """The suspension as the RLJob and its Event tell it (the status's reason may have moved on: a preempted
        job whose quota went back waits for admission again, so the operator's Event is the record of why)."""
        suspension = status.get("suspension") or {}
        events = self.http.get(f"/api/v1/namespaces/{self.namespace}/events").json()["items"]
        said = [
            e["message"] for e in events if e.get("reason") == "Suspended" and e["involvedObject"]["name"] == self.job
        ]
        self.suspensions.append(
            {
                "reason": suspension.get("reason"),
                "event": said[len(self.suspensions)] if len(said) > len(self.suspensions) else None,
                "checkpointedSteps": suspension.get("checkpointedSteps"),
                "replicas": self._replicas(),
                "progress": status.get("progress"),
            }
        )

    def summary(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "log": self.log,
            "suspensions": self.suspensions,
            "held_without_pods": self.held_without_pods,
            "quota_released": self.quota_released,
        }
