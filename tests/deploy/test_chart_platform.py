"""The chart on a platform team's cluster (issue 29), rendered by real Helm (helm-python-sdk): the CRD as a template
kept on uninstall, the upgrade from the chart that had it in crds/, the operator's disruption budget, topology
spread and priority class, and the accounts' annotations and pull Secrets reaching every job pod through the
operator's settings.

The upgrade is judged on what Helm renders for each release (no API server runs here): Helm installs a chart's
crds/ once and never again, and applies every template on each upgrade; the API server prunes fields its CRD's
schema does not declare. The old chart is this repository's at OLD_CHART (the last commit with crds/), from git.
"""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml

from rlboost_operator import cel_eval
from rlboost_operator.children import build_children
from rlboost_operator.config import load_settings
from rlboost_operator.crd import build_crd
from tests.deploy.test_chart import CHART, EXAMPLES, ROOT, operator_deployment, render

OLD_CHART = "d68f8a15316f2836cb90fd1e5b2e8988b174f25e"  # chart 0.1.0 with the CRD in crds/ (before issue 29)
CRD_NAME = "rljobs.rlboost.io"


def docs_of(manifests: dict[str, str]) -> list[dict[str, Any]]:
    return [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]


def render_chart(path: Path, values: dict[str, Any] | None = None, upgrade: bool = False) -> list[dict[str, Any]]:
    with helm.Chart.load(str(path)) as chart:
        manifests = chart.render(
            values or {}, name="rlboost", namespace="rlboost-system", is_install=not upgrade, is_upgrade=upgrade
        )
    return docs_of(manifests)


def crd_of(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((d for d in docs if d["kind"] == "CustomResourceDefinition"), None)


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


@pytest.fixture(scope="module")
def old_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart at OLD_CHART, from git (skips where the clone lacks that commit, e.g. a shallow one)."""
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "archive", OLD_CHART, "deploy/helm/rlboost"], capture_output=True, timeout=60
    )
    if proc.returncode != 0:
        pytest.skip(f"the old chart's commit {OLD_CHART[:8]} is not in this clone: {proc.stderr.decode()[:200]}")
    out = tmp_path_factory.mktemp("old-chart")
    with tarfile.open(fileobj=BytesIO(proc.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out / "deploy" / "helm" / "rlboost"


def test_the_crd_is_a_template_helm_applies_on_every_upgrade_and_keeps_on_uninstall():
    for upgrade in (False, True):
        crd = crd_of(render_chart(CHART, upgrade=upgrade))
        assert crd is not None and crd["metadata"]["name"] == CRD_NAME
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["spec"] == build_crd()["spec"]  # what gen_crd.py generates from the spec, unchanged
    with helm.Chart.load(str(CHART)) as chart:
        assert chart.crds == []  # nothing in crds/, which Helm would install once and never upgrade
    assert crd_of(render_chart(CHART, {"crds": {"install": False}})) is None


def test_an_upgrade_from_the_chart_with_crds_applies_the_new_schema_and_keeps_every_old_rljob_valid(old_chart):
    with helm.Chart.load(str(old_chart)) as chart:
        old_crd = yaml.safe_load(chart.crds[0]["data"])  # installed once, by `helm install` only
    assert crd_of(render_chart(old_chart, upgrade=True)) is None  # so `helm upgrade` of it left the CRD as it was
    new_crd = crd_of(render_chart(CHART, upgrade=True))
    assert new_crd is not None
    old_schema, new_schema = spec_schema(old_crd), spec_schema(new_crd)
    # The new fields: unknown to the old schema (the API server pruned them), declared by the new one.
    platform = yaml.safe_load((ROOT / "examples" / "rljob-platform.yaml").read_text())
    for component in ("podTemplate", "serviceAccount", "env", "envFrom", "priorityClassName", "imagePullSecrets"):
        assert component not in old_schema["properties"]["trainer"]["properties"]
        assert component in new_schema["properties"]["trainer"]["properties"]
    jsonschema.Draft4Validator(new_schema).validate(platform["spec"])
    assert cel_eval.refusals(new_schema, platform["spec"]) == []
    # Every RLJob the old chart accepted (the examples as they were) is valid under the new schema and rules, as a
    # create and as an update of itself (an existing object re-validated on its next edit).
    for path in EXAMPLES:
        if path.name == "rljob-platform.yaml":
            continue
        spec = yaml.safe_load(path.read_text())["spec"]
        jsonschema.Draft4Validator(new_schema).validate(spec)
        assert cel_eval.refusals(new_schema, spec) == [], path.name
        assert cel_eval.refusals(new_schema, spec, old=spec) == [], path.name
    # The upgrade removes nothing the old release made (Helm deletes what a new release no longer renders).
    old_objects = {(d["kind"], d["metadata"]["name"]) for d in render_chart(old_chart)}
    new_objects = {(d["kind"], d["metadata"]["name"]) for d in render_chart(CHART, upgrade=True)}
    assert old_objects <= new_objects, old_objects - new_objects


def test_the_upgrade_path_is_documented_with_the_adoption_of_the_old_crd():
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    section = text[text.index("## Upgrade") :]
    for needed in (
        "meta.helm.sh/release-name",
        "meta.helm.sh/release-namespace",
        "app.kubernetes.io/managed-by=Helm",
        "helm upgrade",
    ):
        assert needed in section, needed


def test_the_operator_replicas_have_a_disruption_budget_a_spread_and_a_priority_class():
    docs = render(None, {"operator": {"priorityClassName": "system-cluster-critical"}})
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    pod = operator_deployment(docs)["spec"]["template"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    spread = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    assert all(c["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items() for c in spread)
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    off = render(None, {"operator": {"podDisruptionBudget": {"enabled": False}, "topologySpread": {"enabled": False}}})
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget"]
    assert "topologySpreadConstraints" not in operator_deployment(off)["spec"]["template"]["spec"]


def test_job_account_annotations_and_pull_secrets_reach_every_job_pod_through_the_operator():
    values = {
        "jobServiceAccounts": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/jobs"}},
        "images": {"pullSecrets": [{"name": "regcred"}]},
    }
    operator = operator_deployment(render(None, values))
    pod = operator["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    settings = load_settings({k: v for k, v in env.items() if v is not None})
    spec = yaml.safe_load((ROOT / "examples" / "rljob-platform.yaml").read_text())["spec"]
    from rlboost.spec import parse_job_spec

    objs = build_children("job", "ml", parse_job_spec(spec), settings, 1)
    accounts = {
        o["metadata"]["name"]: o["metadata"].get("annotations", {}) for o in objs if o["kind"] == "ServiceAccount"
    }
    # the chart's role for every account; the trainer's and reserved pool's own over it
    assert accounts["job-manager"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/jobs"}
    assert accounts["job-trainer"]["eks.amazonaws.com/role-arn"].endswith("role/rlboost-trainer")
    for obj in objs:
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pulls = [p["name"] for p in obj["spec"]["template"]["spec"].get("imagePullSecrets", [])]
            assert pulls[0] == "regcred", obj["metadata"]["name"]
