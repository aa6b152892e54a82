"""The chart's operator in the cluster lane: what `helm install` of deploy/helm/rlboost makes with its default values,
rendered by real Helm (helm-python-sdk): the CRD (templates/crds.yaml) and the operator Deployment, whose replicas
(2: leader election on a Lease in the release's namespace; LANE_VALUES relaxes only its timing) the lane runs as
podman containers, one per replica, each
with the Deployment's command and settings (only its images changed for the lane: its own, never pulled; POD_NAME
set as the downward API would). The podlet does not run them: they reach the API server through a kubeconfig, not a
service-account token.

`kill_leader()` SIGKILLs the replica that holds the Lease (its node went away) and starts it again, as its
Deployment would replace the pod: the survivor takes the Lease over within leaseDurationSeconds, the restarted one
stands by.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlboost"
RELEASE, RELEASE_NAMESPACE = "rlboost", "rlboost-system"
LEASE_S = 60  # the replicas' leaseDurationSeconds: a killed leader's Lease is taken over within it
KUBECONFIG = "/etc/lane/kubeconfig"


# The chart's default mode with its election timing relaxed: on the lane's 2-core machine, shared with other test
# lanes and builds (load 7-28), kmock answered a Lease renewal more than 20 s late (while a job's end scaled its pods
# down), past the default renew deadline of 10 s: the replicas took turns losing the Lease, and a job's `done` waited
# for the next leader. Everything else is the chart's defaults.
LANE_VALUES = {
    "operator": {
        "leaderElection": {"leaseDurationSeconds": LEASE_S, "renewDeadlineSeconds": 45, "retryPeriodSeconds": 5}
    }
}


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's manifests as `helm install rlboost deploy/helm/rlboost -n rlboost-system` renders them."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=RELEASE_NAMESPACE, is_install=True)
    return [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@dataclass
class Replica:
    """One operator replica: its container (`<run>-operator-<i>`), the pod name it runs as, its address."""

    index: int
    pod_name: str
    ip: str = ""

    @property
    def container(self) -> str:
        return f"operator-{self.index}"


class OperatorReplicas:
    """The chart's operator Deployment as containers on the lane's network; `lane` gives container(), run and http."""

    def __init__(self, lane: Any, deployment: dict[str, Any], overrides: dict[str, str], kubeconfig: Path) -> None:
        self.lane = lane
        self.deployment = deployment
        self.overrides = overrides
        self.kubeconfig = kubeconfig
        count = int(deployment["spec"]["replicas"])
        self.replicas = [Replica(i, f"{RELEASE}-operator-lane{i}") for i in range(count)]
        self.killed: list[str] = []  # the pod names of the leaders killed
        self.successor: str | None = None  # the first leader seen after the kill
        self.killed_identity = ""  # the Lease holder that was killed (the record names it until a successor writes)

    @property
    def pod(self) -> dict[str, Any]:
        return self.deployment["spec"]["template"]["spec"]

    def env(self, replica: Replica) -> dict[str, str]:
        """The container's env as the chart sets it (the downward API's POD_NAME filled in), the lane's overrides."""
        container = self.pod["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        return {**env, "POD_NAME": replica.pod_name, "KUBECONFIG": KUBECONFIG, **self.overrides}

    def argv(self, replica: Replica, image: str) -> list[str]:
        container = self.pod["containers"][0]
        argv = [
            "--network",
            f"{self.lane.network}:alias={RELEASE}-operator",
            "-v",
            f"{self.kubeconfig}:{KUBECONFIG}:ro",
            # the kubelet's restartPolicy Always: a replica that lost the Lease exits 1 and comes back as a standby
            "--restart",
            "always",
        ]
        for key, value in self.env(replica).items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, "--entrypoint", json.dumps(container["command"]), image]

    def start(self, image: str) -> None:
        for replica in self.replicas:
            replica.ip = self.lane.container(replica.container, self.argv(replica, image))
        for replica in self.replicas:
            self.lane.wait(lambda r=replica: self.live(r), 120, f"operator replica {replica.index}'s /healthz")

    def liveness_port(self) -> int:
        return int(next(p["containerPort"] for p in self.pod["containers"][0]["ports"] if p["name"] == "liveness"))

    def live(self, replica: Replica) -> bool:
        """Its liveness endpoint answers (a standby answers too); a container that exited fails the lane."""
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"http://{replica.ip}:{self.liveness_port()}/healthz", timeout=2).status_code == 200
        name = f"{self.lane.run_id}-{replica.container}"
        state = self.lane.run_cmd("podman", "inspect", "--format", "{{.State.Running}}", name)
        if state.strip() != "true":
            raise self.lane.error(f"operator replica {replica.index} exited:\n" + self.lane.logs_tail(name, 40))
        return False

    def lease_args(self) -> tuple[str, str]:
        command = self.pod["containers"][0]["command"]
        return command[command.index("--lease-namespace") + 1], command[command.index("--lease-name") + 1]

    def holder(self) -> str:
        """The Lease's holderIdentity ('' when none): a replica's pod name and a suffix new at each start."""
        namespace, name = self.lease_args()
        resp = self.lane.http.get(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
        return ((resp.json().get("spec") or {}).get("holderIdentity") or "") if resp.status_code == 200 else ""

    def leader(self) -> Replica | None:
        """The replica whose identity (its pod name + a suffix) holds the Lease."""
        holder = self.holder()
        return next((r for r in self.replicas if holder.startswith(f"{r.pod_name}_")), None)

    def kill_leader(self) -> str:
        """SIGKILL the leader's container, then start it again (its Deployment's new pod); what happened, in words."""
        leader, self.killed_identity = self.leader(), self.holder()
        if leader is None:
            return "no replica holds the Lease: nothing killed"
        name = f"{self.lane.run_id}-{leader.container}"
        self.lane.run_cmd("podman", "kill", "--signal", "KILL", name)
        self.killed.append(leader.pod_name)
        self.lane.run_cmd("podman", "start", name)
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        leader.ip = self.lane.run_cmd("podman", "inspect", "--format", fmt, name).strip()
        return f"SIGKILL to the leader operator replica {leader.pod_name} (restarted: it stands by)"

    def note_successor(self) -> None:
        """After a kill, the first replica that writes the Lease as its own once it expired: the standby, or the killed
        one restarted under a new identity (they race, as on a cluster)."""
        if self.killed and self.successor is None and self.holder() not in ("", self.killed_identity):
            leader = self.leader()
            self.successor = leader.pod_name if leader is not None else None

    def wait_for_successor(self, timeout_s: float) -> None:
        """After a kill, wait (bounded) for a replica to take the Lease over: a job that ends within the Lease's
        duration of the kill (once the lane's API server answered quickly, it did) ends before anyone may."""
        deadline = time.monotonic() + timeout_s
        while self.killed and self.successor is None and time.monotonic() < deadline:
            self.note_successor()
            if self.successor is None:
                time.sleep(1.0)  # polling the Lease, another process's state

    def targets(self) -> list[str]:
        return [f"{r.ip}:9090" for r in self.replicas]

    def restarts(self) -> dict[str, int]:
        """Each replica's restarts by its restart policy (a replica that lost the Lease exits 1 and is restarted)."""
        out = {}
        for r in self.replicas:
            name = f"{self.lane.run_id}-{r.container}"
            out[r.pod_name] = int(
                self.lane.run_cmd("podman", "inspect", "--format", "{{.RestartCount}}", name).strip() or 0
            )
        return out

    def summary(self, first: Replica | None) -> dict[str, Any]:
        last = self.leader()
        return {
            "replicas": len(self.replicas),
            "leader_first": first.pod_name if first else None,
            "leader_last": last.pod_name if last else None,
            "killed": self.killed,
            "successor": self.successor,
            "restarts": self.restarts(),
        }

    def problems(self, tail: Callable[[str, int], str], lines: int) -> str:
        """Each replica's log lines above INFO (its INFO lines are one per handled event)."""
        out = []
        for replica in self.replicas:
            text = tail(f"{self.lane.run_id}-{replica.container}", 2000)
            keep = [line for line in text.splitlines() if not line.startswith("{") or '"level": "info"' not in line]
            out.append(
                f"--- replica {replica.pod_name}:\n" + ("\n".join(line[:600] for line in keep[-lines:]) or "(none)")
            )
        return "\n".join(out)
