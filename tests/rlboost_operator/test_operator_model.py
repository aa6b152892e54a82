"""The operator and an impossible model source, against kmock's Kubernetes API (real HTTP on loopback) with kopf
running the operator: the RLJob turns Failed with a condition naming spec.model, not a silent crash loop.

kmock runs no kubelet: the test writes the job pod's failed `fetch-model` init container status as the kubelet
would (exit code and termination message of rlboost.models.fetch).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kopf.testing import KopfRunner

from rlboost_operator import children
from tests.helpers import wait_until
from tests.rlboost_operator.test_lifecycle import ARGS, all_zero
from tests.rlboost_operator.test_operator import NS, rljob, status_of


def _model_condition(api, job: str) -> dict[str, Any] | None:
    found = [c for c in status_of(api, job).get("conditions") or [] if c.get("type") == "ModelReady"]
    return found[0] if found else None


def _failed_fetch_pod(job: str, line: str) -> dict[str, Any]:
    terminated = {"exitCode": 3, "reason": "Error", "message": line + "\n"}
    init = {"name": children.FETCH_CONTAINER, "restartCount": 0, "ready": False, "state": {"terminated": terminated}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-trainer-0",
            "namespace": NS,
            "resourceVersion": "1",
            "labels": {"rlboost.io/job": job, "app.kubernetes.io/component": "trainer"},
        },
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Pending", "initContainerStatuses": [init]},
    }


def test_a_failed_fetcher_init_container_ends_the_rljob_failed_naming_spec_model(kube_api, nats_server, monkeypatch):
    """Failed with ModelReady=False naming the field, every workload scaled to zero (no pod crash-loops on the
    fetch), and Failed still after the operator restarts (it used to turn Pending and start the pods again)."""
    api = kube_api
    with _operator(api, monkeypatch, nats_server.url) as first:
        _fail_a_fetch(api)
    assert first.exception is None, first.output
    api.patch("Deployment", NS, "hfjob-manager", {"spec": {"replicas": 1}})  # undone only by a reconcile
    with _operator(api, monkeypatch, nats_server.url) as second:
        wait_until(lambda: all_zero(api, "hfjob"), timeout=20, what="the restarted operator's reconcile")
        assert status_of(api, "hfjob")["phase"] == "Failed"
    assert second.exception is None, second.output


def _operator(api, monkeypatch, nats_url: str) -> KopfRunner:
    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", nats_url)
    return KopfRunner(ARGS, timeout=30)


def _fail_a_fetch(api) -> None:
    wait_until(lambda: api.watched("pods"), timeout=20, what="the operator's watch on pods")
    token = base64.b64encode(b"hf_expired").decode()
    api.create(
        "Secret",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hf", "namespace": NS, "resourceVersion": "1"},
            "data": {"token": token},
        },
    )
    model = {"source": "huggingface", "repo": "acme/private-model", "tokenSecret": "hf"}
    api.create("RLJob", rljob("hfjob", {"model": model}))
    wait_until(lambda: status_of(api, "hfjob").get("phase") == "Pending", timeout=20, what="phase Pending")
    line = "spec.model.tokenSecret: Unauthorized: the Hub refused the token for acme/private-model (HTTP 401)"
    api.create("Pod", _failed_fetch_pod("hfjob", line))
    wait_until(lambda: status_of(api, "hfjob").get("phase") == "Failed", timeout=20, what="phase Failed")
    cond = _model_condition(api, "hfjob")
    assert (cond["status"], cond["reason"]) == ("False", "Unauthorized")
    assert cond["message"] == "spec.model.tokenSecret: the Hub refused the token for acme/private-model (HTTP 401)"
    wait_until(
        lambda: any(e.get("reason") == "Unauthorized" and e.get("type") == "Warning" for e in api.list("Event", NS)),
        timeout=20,
        what="a Warning event",
    )
    wait_until(lambda: all_zero(api, "hfjob"), timeout=20, what="every workload at zero")
    stopped = next(c for c in status_of(api, "hfjob")["conditions"] if c["type"] == "Stopped")
    assert stopped["reason"] == "ModelUnavailable"


def test_a_missing_claim_fails_the_rljob_before_any_child_and_it_starts_once_the_claim_exists(
    operator, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("rlboost_operator.lifecycle.MODEL_RECHECK_S", 1)
    api = operator
    api.create("RLJob", rljob("pvcjob", {"model": {"source": "pvc", "claimName": "models", "path": "qwen3"}}))
    wait_until(lambda: status_of(api, "pvcjob").get("phase") == "Failed", timeout=20, what="phase Failed")
    cond = _model_condition(api, "pvcjob")
    assert cond["reason"] == "ClaimNotFound" and cond["message"].startswith("spec.model.claimName: ")
    assert "'models'" in cond["message"] and api.get("StatefulSet", NS, "pvcjob-trainer") is None
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models", "namespace": NS, "resourceVersion": "1"},
        "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    api.create("PersistentVolumeClaim", claim)
    sts = wait_until(lambda: api.get("StatefulSet", NS, "pvcjob-trainer"), timeout=20, what="the trainer")
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    wait_until(lambda: status_of(api, "pvcjob").get("phase") == "Pending", timeout=20, what="phase Pending")
    assert _model_condition(api, "pvcjob") is None
