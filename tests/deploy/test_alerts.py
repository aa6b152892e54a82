"""The chart's alert rules (deploy/helm/rlboost/rules/alerts.yaml) unit-tested by real `promtool test rules`
(tests/deploy/alerts_test.yaml: each alert fires on the series it is for, at the time it should, with its
labels and rendered annotations, and stays silent before), and every metric named by an alert or a dashboard
panel exported by some component, so a renamed metric cannot leave a panel or an alert silently empty.

promtool comes from Debian's `prometheus` package (`make tools` installs it); without it the promtool test skips."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from tests.deploy.test_chart import CHART, render

ROOT = Path(__file__).resolve().parents[2]
RULES = CHART / "rules" / "alerts.yaml"
PROMTOOL = shutil.which("promtool")
METRIC = re.compile(r"\b(rlboost_[a-z_]+)\b")
SOURCES = ["rlboost", "operator", "services"]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed: `make tools` (Debian package prometheus)")
def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    check = _promtool("check", "rules", str(RULES))
    assert check.returncode == 0, check.stdout + check.stderr
    tested = _promtool("test", "rules", "tests/deploy/alerts_test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tested_alerts = set(re.findall(r"alertname: (\w+)", (ROOT / "tests/deploy/alerts_test.yaml").read_text()))
    assert alerts == tested_alerts, f"alerts without a promtool test: {alerts - tested_alerts}"


def test_the_chart_embeds_the_rules_file_when_enabled() -> None:
    docs = render(None, {"monitoring": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}}})
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    (pods,) = [d for d in docs if d["kind"] == "PodMonitor"]
    relabel = pods["spec"]["podMetricsEndpoints"][0]["relabelings"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_rlboost_io_job"], "targetLabel": "rljob"} in relabel
    assert not any(d["kind"] == "PrometheusRule" for d in render(None))  # off by default: needs the CRDs


METRICS_MODULES = [
    "rlboost_operator.metrics",
    "rollout_manager.metrics",
    "weight_server.metrics",
    "trainer.metrics",
    "rollout_worker.metrics",
]


def _exported_metrics() -> set[str]:
    """Every rlboost_* name that appears as a string literal in the components' code, and every series the
    components' metrics modules register when imported (the trainer's step gauges are made from StepReport's
    fields, so their names are built, not written)."""
    names: set[str] = set()
    for src in SOURCES:
        for path in (ROOT / src).rglob("*.py"):
            names |= set(re.findall(r"[\"'](rlboost_[a-z_]+)[\"']", path.read_text()))
    for module in METRICS_MODULES:
        importlib.import_module(module)
    names |= {s.name for family in REGISTRY.collect() for s in family.samples}
    return names


def _referenced(text: str) -> set[str]:
    """Metric names used in PromQL, less the histogram/counter suffixes Prometheus adds at exposition."""
    return {re.sub(r"_(bucket|sum|count)$", "", m) for m in METRIC.findall(text)}


def test_every_metric_an_alert_or_panel_uses_is_exported() -> None:
    exported = _exported_metrics()
    panels = json.loads((CHART / "dashboards" / "rlboost.json").read_text())["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    missing = (_referenced(exprs) | _referenced(RULES.read_text())) - exported
    assert missing == set(), f"named in a panel or an alert but exported by nothing: {sorted(missing)}"
    assert "by (job)" not in exprs, "group by `rljob`: `job` is Prometheus' own scrape-job label"
