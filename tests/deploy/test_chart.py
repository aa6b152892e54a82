"""The Helm chart rendered by real Helm (helm-python-sdk binds Helm's Go SDK in-process) for the default
values and every cloud values file; every rendered manifest validated strictly with kubernetes-validate
(custom kinds against their CRD's schema); every example RLJob validated against the generated CRD."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from rlboost_operator.__main__ import election_config, parse_args
from rlboost_operator.checks import check_job
from rlboost_operator.config import OperatorSettings, load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlboost"
K8S_VERSION = "1.30.0"
VALUES_FILES = [None, "values-gke.yaml", "values-eks.yaml", "values-karpenter.yaml"]
EXAMPLES = sorted((ROOT / "examples").glob("rljob*.yaml"))


def crd_docs() -> dict[str, dict[str, Any]]:
    """The chart's CRDs by kind (files/crds/, which templates/crds.yaml installs)."""
    out = {}
    for path in sorted((CHART / "files" / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out[doc["spec"]["names"]["kind"]] = doc
    return out


def render(values_file: str | None, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    values = yaml.safe_load((CHART / values_file).read_text()) if values_file else {}
    values.update(extra or {})
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name="rlboost", namespace="rlboost-system", is_install=True)
    docs = []
    for text in manifests.values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def validate(doc: dict[str, Any], crds: dict[str, dict[str, Any]]) -> None:
    kind = doc["kind"]
    if kind in crds:
        schema = crds[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        jsonschema.Draft4Validator(schema).validate(doc)
    elif kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        # The Prometheus Operator's schemas are not available offline: check the fields it requires (the rules
        # themselves go through promtool in test_alerts.py).
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        endpoints = doc["spec"].get("endpoints") or doc["spec"].get("podMetricsEndpoints") or [{"port": "metrics"}]
        assert endpoints[0]["port"] == "metrics"
        assert kind == "PrometheusRule" or doc["spec"]["selector"]["matchLabels"]
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("values_file", VALUES_FILES)
def test_chart_renders_and_every_manifest_validates(values_file):
    crds = crd_docs()
    docs = render(values_file)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "NetworkPolicy"} <= kinds
    for doc in docs:
        validate(doc, crds)
    for crd in crds.values():
        kubernetes_validate.validate(crd, K8S_VERSION, strict=True)
    operator = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rlboost-operator")
    pod = operator["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["command"][:3] == ["python", "-m", "rlboost_operator"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert "RLBOOST_OPERATOR_NATS_URL" not in env  # each job's own NATS, at its Service
    assert env["RLBOOST_OPERATOR_OPERATOR_NAMESPACE"] == "rlboost-system"
    if values_file:
        registry = yaml.safe_load((CHART / values_file).read_text())["images"]["registry"]
        assert env["RLBOOST_OPERATOR_IMAGE_REGISTRY"] == registry
    # Every setting the chart gives the operator is valid; cloud presets size spot pools for their autoscaler.
    settings = load_settings({k: v for k, v in env.items() if v is not None})
    assert settings.metrics_namespace_labels == {"kubernetes.io/metadata.name": "monitoring"}
    assert settings.network_policy and settings.nats_image.startswith("nats:")
    assert settings.spot_sizing == ("capacity" if values_file is None else "autoscaler")
    monitored = values_file in ("values-eks.yaml", "values-karpenter.yaml")
    assert ("ServiceMonitor" in kinds) == ("PodMonitor" in kinds) == monitored


def test_toggles_and_dashboard():
    docs = render(None, {"operator": {"watchNamespaces": ["ml"]}, "networkPolicy": {"enabled": False}})
    assert not any(d["kind"] == "Service" and d["metadata"]["name"] == "rlboost-nats" for d in docs)  # per job now
    assert not any(d["kind"] == "NetworkPolicy" for d in docs)
    operator = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert load_settings({k: v for k, v in env.items() if v is not None}).network_policy is False
    assert operator["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--namespace", "ml"]
    dash = next(d for d in render(None) if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rlboost-dashboard")
    panels = json.loads(dash["data"]["rlboost.json"])["panels"]
    exprs = " ".join(t["expr"] for p in panels for t in p.get("targets", []))
    for metric in (
        "rlboost_trainer_reward_mean",
        "rlboost_manager_tokens_lost_total",
        "rlboost_operator_desired_spot_replicas",
    ):
        assert metric in exprs


def test_the_dashboard_has_its_rows_variables_and_a_unit_and_description_on_every_panel():
    dashboard = json.loads((CHART / "dashboards" / "rlboost.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    for wanted in ("progress", "Step time split", "per pool", "Migrations and preemptions", "Weight sync", "health"):
        assert any(wanted in row for row in rows), (wanted, rows)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["namespace"]["includeAll"] and variables["rljob"]["multi"]
    assert "$namespace" in variables["rljob"]["query"]["query"]  # jobs of the chosen namespaces
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    for panel in panels:
        assert panel.get("description") and panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        for target in panel["targets"]:
            per_job = "rljob" in target["expr"] and "by (rljob" in target["expr"]
            assert not per_job or ('rljob=~"$rljob"' in target["expr"] and "$namespace" in target["expr"]), target
    titles = " ".join(p["title"] for p in panels)
    for wanted in ("Loss", "KL", "Entropy", "Clip fraction", "Response length", "p95 weight-sync", "Cost", "Phase"):
        assert wanted in titles, wanted


def test_kueue_rbac_only_with_kueue_enabled():
    """The Workload rights (and reading ResourceFlavors and WorkloadPriorityClasses) come with kueue.enabled."""
    for install in ({}, {"watchNamespaces": ["ml"]}):
        off = render(None, {"operator": install} if install else None)
        assert not [
            r
            for d in off
            if d["kind"] in ("Role", "ClusterRole")
            for r in d["rules"]
            if "kueue.x-k8s.io" in r["apiGroups"]
        ]
        docs = render(None, {"kueue": {"enabled": True}, **({"operator": install} if install else {})})
        roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole") and "leader" not in d["metadata"]["name"]]
        rules = {}
        for role in roles:
            rules.update(
                {
                    k: v
                    for k, v in _rules(role).items()
                    if k in ("workloads", "workloads/status", "resourceflavors", "workloadpriorityclasses")
                }
            )
        assert rules == {
            "workloads": {"get", "list", "watch", "create", "patch"},
            "workloads/status": {"get", "patch"},
            "resourceflavors": {"get"},
            "workloadpriorityclasses": {"get"},
        }, install
        env = {
            e["name"]: e.get("value")
            for e in operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        settings = load_settings({k: v for k, v in env.items() if v is not None})
        assert settings.kueue is True and settings.suspend_timeout_s == 1800.0
        reader = next(d for d in docs if d["kind"] == "ClusterRoleBinding" and "kueue" in d["metadata"]["name"])
        assert reader["subjects"] == [
            {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
        ]


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rlboost-operator")


@pytest.mark.parametrize(
    "operator_values", [{}, {"watchNamespaces": ["ml", "research"]}], ids=["cluster-wide", "namespaced"]
)
def test_operator_replicas_elect_a_leader_on_a_lease_in_the_release_namespace(operator_values, monkeypatch):
    docs = render(None, {"operator": operator_values} if operator_values else None)
    deployment = operator_deployment(docs)
    assert deployment["spec"]["replicas"] == 2 and "strategy" not in deployment["spec"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # The operator's own parser accepts the chart's flags, and the timing is consistent.
    monkeypatch.setenv("POD_NAME", "rlboost-operator-abc")
    args = parse_args(container["command"][3:])
    assert args.leader_elect and args.namespace == operator_values.get("watchNamespaces", [])
    config = election_config(args, None)
    assert (config.lease_name, config.lease_namespace) == ("rlboost-operator", "rlboost-system")
    assert config.identity.startswith("rlboost-operator-abc_")

    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"].endswith("leader-election"))
    assert role["metadata"]["namespace"] == "rlboost-system"
    assert {g for r in role["rules"] for g in r["apiGroups"]} == {"coordination.k8s.io"}
    assert {x for r in role["rules"] for x in r["resources"]} == {"leases"}
    by_verbs = {tuple(sorted(r["verbs"])): r.get("resourceNames") for r in role["rules"]}
    assert by_verbs == {("create",): None, ("get", "update"): ["rlboost-operator"]}
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == role["metadata"]["name"])
    assert binding["metadata"]["namespace"] == "rlboost-system"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rlboost-operator", "namespace": "rlboost-system"}
    ]


def test_kopf_peering_is_gone():
    """Peering froze both replicas (it is not leader election): no peering objects, CRDs, flags or rules."""
    for values in (None, {"operator": {"watchNamespaces": ["ml"]}}):
        docs = render(None, values)
        assert not [d for d in docs if d["apiVersion"].startswith("kopf.dev/")]
        assert not [
            r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"] if "kopf.dev" in r["apiGroups"]
        ]
        assert "--peering" not in operator_deployment(docs)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert {crd["spec"]["group"] for crd in crd_docs().values()} == {"rlboost.io"}


def test_helm_lint_is_clean():
    report = helm.lint(str(CHART), strict=True, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _rules(doc: dict[str, Any]) -> dict[str, set[str]]:
    """Verbs by resource of a Role or ClusterRole."""
    out: dict[str, set[str]] = {}
    for rule in doc["rules"]:
        for resource in rule["resources"]:
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def test_rbac_is_least_privilege():
    role = next(d for d in render(None) if d["kind"] == "ClusterRole")
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs and "delete" not in verbs
    rules = _rules(role)
    # by name only: no list or watch of Secrets; patch adds an item (worker-identity.json follows the cluster's keys)
    assert rules["secrets"] == {"create", "get", "patch"}
    assert rules["networkpolicies"] == {"get", "create", "patch"}  # each job's own
    assert rules["serviceaccounts"] == {"get", "create", "patch"}  # each job's accounts (no rights of their own)
    assert rules["poddisruptionbudgets"] == {"get", "create", "patch"}  # each job's single-replica services


def test_a_namespaced_install_reads_secrets_and_makes_workloads_only_in_its_namespaces():
    docs = render(None, {"operator": {"watchNamespaces": ["ml", "research"]}})
    cluster = _rules(next(d for d in docs if d["kind"] == "ClusterRole"))
    assert set(cluster) == {"nodes", "namespaces", "customresourcedefinitions"}  # cluster-scoped only
    namespaced = ("secrets", "deployments", "serviceaccounts")
    assert not {"get", "list", "watch", "create"} & {v for r in namespaced for v in cluster.get(r, ())}
    roles = {
        d["metadata"]["namespace"]: d for d in docs if d["kind"] == "Role" and "leader" not in d["metadata"]["name"]
    }
    assert set(roles) == {"ml", "research"}
    for namespace, role in roles.items():
        rules = _rules(role)
        assert rules["secrets"] == {"create", "get", "patch"} and "deployments" in rules and "rljobs" in rules, (
            namespace
        )
        assert rules["serviceaccounts"] == {"get", "create", "patch"}, namespace
        assert rules["poddisruptionbudgets"] == {"get", "create", "patch"}, namespace
        binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == namespace)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rlboost-operator",
        }
        assert binding["subjects"][0]["namespace"] == "rlboost-system"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_and_the_operator_checks(path):
    schema = crd_docs()["RLJob"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    doc = yaml.safe_load(path.read_text())
    jsonschema.Draft4Validator(schema).validate(doc)
    check_job(doc["spec"], OperatorSettings())


def test_examples_cover_every_cloud():
    assert {p.name for p in EXAMPLES} >= {"rljob.yaml", "rljob-gke.yaml", "rljob-eks.yaml", "rljob-karpenter.yaml"}


def test_checked_in_crd_is_generated_from_the_spec():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_crd.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def _base_image(text: str) -> str:
    """The first FROM's image, with `${ARG}` replaced by the ARG's default (as `docker build` does)."""
    args = dict(
        line.split(None, 1)[1].split("=", 1) for line in text.splitlines() if line.startswith("ARG ") and "=" in line
    )
    base = next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), base)


def test_dockerfiles_pin_bases_and_drop_root():
    for path in sorted((ROOT / "docker").glob("*.Dockerfile")):
        text = path.read_text()
        base = _base_image(text)
        assert ":" in base and "$" not in base and not base.endswith(":latest"), f"{path.name}: FROM {base}"
        assert "\nUSER 10001:10001\n" in text, path.name
    assert "lmsysorg/sglang:" in (ROOT / "docker" / "rollout-worker-sglang.Dockerfile").read_text()
