"""The lane's stand-in for prometheus-operator: the chart's PodMonitor -> file_sd targets; dashboard queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import prometheus_lane
from prometheus_lane import POD_MONITOR_PORTS, POD_MONITOR_SELECTOR, RELABEL, panel_queries, targets_from_pods

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rlboost"


def test_the_lane_selects_and_relabels_what_the_charts_podmonitor_does() -> None:
    text = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert all(f"{k}: {v}" in text for k, v in POD_MONITOR_SELECTOR.items())
    assert re.search(r'range list ((?:"\w+" ?)+)', text).group(1).split() == [f'"{p}"' for p in POD_MONITOR_PORTS]
    for label, target in RELABEL.items():
        meta = "__meta_kubernetes_pod_label_" + re.sub(r"[./-]", "_", label)
        assert re.search(rf"\[{meta}\]\s+targetLabel: {target}\b", text), (label, target)


def test_targets_are_every_selected_pod_at_each_monitored_port() -> None:
    labels = {
        **POD_MONITOR_SELECTOR,
        "rlboost.io/job": "j",
        "rlboost.io/pool": "spot",
        "app.kubernetes.io/component": "w",
    }
    pods = [
        {"name": "w-1", "ip": "10.0.0.5", "ready": False, "labels": labels, "ports": {"metrics": 9090}},
        {"name": "ws", "ip": "10.0.0.6", "ready": True, "labels": POD_MONITOR_SELECTOR, "ports": {"http": 8000}},
        {"name": "other", "ip": "10.0.0.7", "ready": True, "labels": {}, "ports": {"metrics": 9090}},
    ]
    groups = targets_from_pods(pods, "ns")
    assert [g["targets"] for g in groups] == [["10.0.0.5:9090"], ["10.0.0.6:8000"]]
    assert groups[0]["labels"] == {
        "job": "ns/rlboost-jobs",
        "namespace": "ns",
        "pod": "w-1",
        "endpoint": "metrics",
        "__scheme__": "http",
        "rljob": "j",
        "pool": "spot",
        "component": "w",
    }
    assert groups[1]["labels"]["__scheme__"] == "https"  # the weight-server's API port serves TLS


def test_every_dashboard_panel_has_a_query() -> None:
    dashboard = json.loads((CHART / "dashboards" / "rlboost.json").read_text())
    queries = panel_queries(dashboard)
    assert queries and all(expr for _, expr in queries)


def test_panel_queries_take_the_dashboards_variables_as_grafana_does() -> None:
    dashboard = json.loads((CHART / "dashboards" / "rlboost.json").read_text())
    chosen = panel_queries(dashboard, {"namespace": "ml", "rljob": "addition-tiny"})
    assert not any("$" in expr for _, expr in chosen)
    assert any('rljob=~"addition-tiny"' in expr and 'namespace=~"ml"' in expr for _, expr in chosen)
    everything = panel_queries(dashboard)  # no value chosen: "All"
    assert any('rljob=~".*"' in expr for _, expr in everything) and not any("$" in e for _, e in everything)


def test_the_agentic_row_is_left_out_for_a_job_without_episodes_and_only_it():
    """The lane judges every panel of the chart's dashboard but the agentic row's for a job with no
    task.environment (no env-runner exports those series)."""
    dashboard = json.loads((CHART / "dashboards" / "rlboost.json").read_text())
    kept = prometheus_lane.without_row(dashboard, prometheus_lane.AGENTIC_ROW)
    titles = lambda d: [t for t, _ in prometheus_lane.panel_queries(d)]  # noqa: E731
    gone = set(titles(dashboard)) - set(titles(kept))
    agentic = ("env_runner", "episode", "turns", "in_tools")
    assert gone and all(any(a in e for a in agentic) for t, e in panel_queries(dashboard) if t in gone), gone
    assert "Mean reward" in titles(kept) and len(kept["panels"]) < len(dashboard["panels"])
