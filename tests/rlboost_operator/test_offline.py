"""`rlboost validate` and `rlboost render` (rlboost_operator.offline): what a cluster would refuse, named field by field
and source by source, and the objects the operator creates, printed offline and compared with what the real operator
(kopf against kmock, as in test_operator.py) made for the same RLJob."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from rlboost_operator import offline
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ROOT / "examples" / "rljob-platform.yaml"
NS = "team-a"


def platform_job(name: str = "plat") -> dict[str, Any]:
    job = yaml.safe_load(PLATFORM.read_text())
    job["metadata"] = {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"}
    return job


def test_validate_names_each_problem_once_with_what_refuses_it():
    job = platform_job()
    assert offline.problems(job) == []
    bad = copy.deepcopy(job)
    bad["spec"]["trainer"]["gpusPerRank"] = 2  # a CEL rule refuses it at apply (the spec model too: shown once)
    found = offline.problems(bad)
    assert [(p.path, p.source) for p in found] == [("spec.trainer.gpusPerRank", "CEL rule")], found
    bad = copy.deepcopy(job)
    bad["spec"]["rollout"]["reserved"]["podTemplate"]["spec"]["containers"][0]["name"] = "sidecar"  # the operator
    found = offline.problems(bad)
    assert [(p.path, p.source) for p in found] == [
        ("spec.rollout.reserved.podTemplate.spec.containers.0.name", "operator")
    ], found
    assert "no container 'sidecar'" in found[0].message and "rollout-worker" in found[0].message
    typo = copy.deepcopy(job)
    typo["spec"]["trainer"]["ranks"] = "two"
    found = offline.problems(typo)
    assert found[0] == offline.Problem("spec.trainer.ranks", "schema", "'two' is not of type 'integer'")
    assert len({p.path for p in found}) == len(found) == 1  # the spec model says the same: shown once


def test_the_cli_verbs_run_the_operators_module_and_exit_with_its_verdict(tmp_path: Path):
    ok = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "validate", str(PLATFORM), str(ROOT / "examples" / "rljob.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "RLJob addition-platform is valid" in ok.stdout and "RLJob addition-tiny is valid" in ok.stdout
    bad = platform_job()
    bad["spec"]["services"]["manager"]["podTemplate"]["spec"]["automountServiceAccountToken"] = True
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    refused = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"{path} RLJob plat: spec.services.manager.podTemplate.spec.automountServiceAccountToken: podTemplate.spec."
        "automountServiceAccountToken is the operator's; set the component's serviceAccount (CEL rule)"
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "render", str(PLATFORM), "-n", "ml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(shown.stdout) if d]
    assert kinds[:2] == ["Secret", "Secret"] and kinds.count("StatefulSet") == 1 and "PodDisruptionBudget" in kinds
    assert "rlboost render: the operator's package" not in shown.stderr


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """What render promises of an object: its kind, identity, labels, annotations, owners and content (a Secret's
    item names; the API server's own metadata aside)."""
    meta = obj["metadata"]
    content = {k: v for k, v in obj.items() if k not in ("metadata", "status", "data")}
    return {
        "kind": obj["kind"],
        "name": meta["name"],
        "namespace": meta.get("namespace"),
        "labels": meta.get("labels"),
        "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k != offline.GENERATED} or None,
        "owners": [{k: v for k, v in o.items() if k != "uid"} for o in meta.get("ownerReferences") or []],
        "items": sorted(obj.get("data") or {}),
        **content,
    }


def test_render_prints_exactly_what_the_operator_creates(operator):
    api = operator
    job = platform_job()
    api.create("RLJob", job)
    spot = wait_until(lambda: api.get("Deployment", NS, "plat-workers-spot"), timeout=60, what="the spot Deployment")
    rendered = offline.rendered(job, NS, spot["spec"]["replicas"])
    assert len(rendered) == 24
    for obj in rendered:
        kind, name = obj["kind"], obj["metadata"]["name"]
        made = wait_until(lambda k=kind, n=name: api.get(k, NS, n), timeout=20, what=f"{kind} {name}")
        assert _comparable(obj) == _comparable(made), f"{kind} {name}"
