"""The cluster lane's Prometheus: a real server (Debian's `prometheus`) scraping what the chart's PodMonitor selects.

No prometheus-operator runs here, so this module does its part: the PodMonitor of
deploy/helm/rlboost/templates/podmonitor.yaml selects every pod labelled `app.kubernetes.io/part-of: rlboost` and
`app.kubernetes.io/managed-by: rlboost-operator` and scrapes its ports named `metrics` and `http` at /metrics,
relabelling the pod's `rlboost.io/job`, `rlboost.io/pool` and component labels to `rljob`, `pool` and `component`;
the podlet's pods.json becomes a file_sd target list with those labels and the ones prometheus-operator adds
(job = <namespace>/<PodMonitor name>, namespace, pod, container, endpoint). The ServiceMonitor (the operator's
own Service) is the lane's operator container, added by the caller. `panels_without_data` runs every query of
the Grafana dashboard against the server.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

# Run by the venv's python, where rlboost is installed: ports picked outside the ephemeral range, as everywhere.
from rlboost.nats_server import free_port

# What the chart's PodMonitor selects (tests/cluster/test_prometheus_lane.py keeps these in step with it).
POD_MONITOR_SELECTOR = {"app.kubernetes.io/part-of": "rlboost", "app.kubernetes.io/managed-by": "rlboost-operator"}
POD_MONITOR_PORTS = ("metrics", "http")
POD_MONITOR_SCHEME = {"http": "https"}  # the PodMonitor scrapes the weight-server's API port over TLS
POD_MONITOR_NAME = "rlboost-jobs"
RELABEL = {"rlboost.io/job": "rljob", "rlboost.io/pool": "pool", "app.kubernetes.io/component": "component"}
SCRAPE_INTERVAL_S = 5


def targets_from_pods(pods: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """file_sd groups: one per selected running pod and monitored port it names (PodMonitors skip readiness)."""
    groups = []
    for pod in sorted(pods, key=lambda p: p["name"]):
        labels = pod.get("labels") or {}
        if any(labels.get(k) != v for k, v in POD_MONITOR_SELECTOR.items()):
            continue
        for port_name in POD_MONITOR_PORTS:
            if port_name not in pod.get("ports", {}):
                continue
            target_labels = {
                "job": f"{namespace}/{POD_MONITOR_NAME}",
                "namespace": namespace,
                "pod": pod["name"],
                "endpoint": port_name,
                "__scheme__": POD_MONITOR_SCHEME.get(port_name, "http"),
            }
            target_labels.update({new: labels[old] for old, new in RELABEL.items() if old in labels})
            groups.append({"targets": [f"{pod['ip']}:{pod['ports'][port_name]}"], "labels": target_labels})
    return groups


AGENTIC_ROW = "Agentic episodes"  # the dashboard row of jobs with task.environment


def without_row(dashboard: dict[str, Any], title_prefix: str) -> dict[str, Any]:
    """`dashboard` without the row whose title starts with `title_prefix` and the panels under it (up to the next
    row; a collapsed row holds its panels itself)."""
    kept, inside = [], False
    for panel in dashboard.get("panels") or []:
        if panel.get("type") == "row":
            inside = panel.get("title", "").startswith(title_prefix)
        if not inside:
            kept.append(panel)
    return {**dashboard, "panels": kept}


def panel_queries(dashboard: dict[str, Any], variables: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included; each `$name` / `${name}` of the
    dashboard's variables replaced by its value in `variables`, as Grafana does (a variable given no value reads as
    its "All", the regex `.*`)."""
    values = {
        v["name"]: ".*" for v in (dashboard.get("templating") or {}).get("list") or [] if v["name"] != "datasource"
    }
    values.update(variables or {})
    out: list[tuple[str, str]] = []
    for panel in dashboard.get("panels") or []:
        for inner in [panel, *(panel.get("panels") or [])]:
            for target in inner.get("targets") or []:
                if target.get("expr"):
                    out.append((inner.get("title", "?"), substitute(target["expr"], values)))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    for name in sorted(values, key=len, reverse=True):  # $rljob before a variable named $r, were there one
        expr = expr.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    return expr


class Prometheus:
    """A Prometheus server on loopback whose targets come from a file the lane rewrites."""

    def __init__(self, state: Path, extra_targets: list[dict[str, Any]]) -> None:
        self.dir = state / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.targets_file = self.dir / "targets.json"
        self.extra = extra_targets
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.write_targets([])
        config = self.dir / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "evaluation_interval": "15s"},
                    "scrape_configs": [
                        {
                            "job_name": "servicemonitor",
                            "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "5s"}],
                            "tls_config": {"insecure_skip_verify": True},  # as the PodMonitor's tlsConfig
                        }
                    ],
                }
            )
        )
        log = (self.dir / "prometheus.log").open("wb")
        argv = ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}"]
        argv += [f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"]
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited: " + (self.dir / "prometheus.log").read_text()[-1500:])
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("prometheus did not become ready in 60 s")

    def write_targets(self, groups: list[dict[str, Any]]) -> None:
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([*groups, *self.extra], indent=1))
        tmp.replace(self.targets_file)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query, now or as of `at` (unix seconds): a finished job's pods are gone, its data is not."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        resp = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10).raise_for_status()
        return resp.json()["data"]["result"]

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """A range query over [start, end] at the scrape interval, as a Grafana panel over that time asks it."""
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{SCRAPE_INTERVAL_S}s"}
        resp = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=30).raise_for_status()
        return [series for series in resp.json()["data"]["result"] if series.get("values")]

    def panels_without_data(
        self,
        dashboard: dict[str, Any],
        at: float | None = None,
        between: tuple[float, float] | None = None,
        variables: dict[str, str] | None = None,
    ) -> list[str]:
        """Titles of the panels none of whose queries returns a series: now, as of `at`, or (what a dashboard
        showing that time range draws) at any point `between` (start, end); `variables`: the dashboard's variables
        as chosen (namespace, rljob), each other one "All"."""
        results: dict[str, bool] = {}
        for title, expr in panel_queries(dashboard, variables):
            found = self.query_range(expr, *between) if between else self.query(expr, at)
            results[title] = results.get(title, False) or bool(found)
        return [title for title, has_data in results.items() if not has_data]

    def failed_scrapes(self, start: float, end: float) -> dict[str, int]:
        """Scrapes that failed (up == 0) per target between start and end: a target that timed out leaves gaps,
        and each failed scrape marks the target's series stale."""
        out: dict[str, int] = {}
        for series in self.query_range("up == 0", start, end):
            name = series["metric"].get("pod") or series["metric"].get("job", "?")
            out[name] = out.get(name, 0) + len(series["values"])
        return out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
