"""The lane's stand-in for prometheus-operator: ServiceMonitor selection -> file_sd targets; dashboard queries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_lane import SERVICE_MONITOR_PORT, SERVICE_MONITOR_SELECTOR, panel_queries, targets_from_endpoints

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rlboost"


def test_the_lane_selects_what_the_charts_servicemonitor_selects() -> None:
    text = (CHART / "templates" / "servicemonitor.yaml").read_text()
    spec_text = text[text.index("spec:") :].split("{{- end }}")[0]
    spec = yaml.safe_load(re.sub(r"\{\{.*?\}\}", "templated", spec_text))["spec"]
    assert spec["selector"]["matchLabels"] == SERVICE_MONITOR_SELECTOR
    assert [e["port"] for e in spec["endpoints"]] == [SERVICE_MONITOR_PORT]


def test_targets_are_the_ready_pods_of_selected_services_at_their_metrics_port() -> None:
    pod = {"name": "m-1", "ip": "10.0.0.5", "ready": True, "ports": {"metrics": 9090}}
    endpoints = {
        "m": {
            "labels": SERVICE_MONITOR_SELECTOR,
            "ports": [{"name": "metrics", "port": 9090, "targetPort": "metrics"}],
            "pods": [pod, {**pod, "name": "m-2", "ready": False}],
        },
        "other": {"labels": {}, "ports": [{"name": "metrics", "port": 9090}], "pods": [pod]},
        "nometrics": {"labels": SERVICE_MONITOR_SELECTOR, "ports": [{"name": "http", "port": 80}], "pods": [pod]},
    }
    groups = targets_from_endpoints(endpoints, "ns")
    assert groups == [
        {
            "targets": ["10.0.0.5:9090"],
            "labels": {"job": "m", "namespace": "ns", "service": "m", "pod": "m-1", "endpoint": "metrics"},
        }
    ]


def test_every_dashboard_panel_has_a_query() -> None:
    dashboard = json.loads((CHART / "dashboards" / "rlboost.json").read_text())
    queries = panel_queries(dashboard)
    assert queries and all(expr for _, expr in queries)
