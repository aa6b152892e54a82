"""How the model reaches the job's pods (pure): the init container and volume per model source, the spot
workers' lack of both, and what a failed fetcher's status and a missing claim or Secret mean."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import kubernetes_validate
import pytest

from rlboost.spec import parse_job_spec
from rlboost_operator import children, model_source, status
from rlboost_operator.checks import SpecProblemError, check_job
from rlboost_operator.config import OperatorSettings

K8S_VERSION = "1.30.0"
SOURCES = {
    "tiny": {"source": "tiny"},
    "huggingface": {"source": "huggingface", "repo": "Qwen/Qwen3-0.6B", "revision": "c1899de", "tokenSecret": "hf"},
    "uri": {"source": "uri", "uri": "s3://models/qwen3"},
    "pvc": {"source": "pvc", "claimName": "models", "path": "qwen3"},
}


def _pods(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = parse_job_spec({"model": model})
    objs = children.build_children("job1", "ns1", spec, OperatorSettings(), spot_replicas=1)
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    by = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment", "StatefulSet")}
    return {
        "trainer": by["job1-trainer"]["spec"]["template"]["spec"],
        "reserved": by["job1-workers-reserved"]["spec"]["template"]["spec"],
        "spot": by["job1-workers-spot"]["spec"]["template"]["spec"],
    }


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_trainer_and_reserved_workers_fetch_the_model_before_they_start(source: str) -> None:
    pods = _pods(SOURCES[source])
    expected_dir = "/models/policy/qwen3" if source == "pvc" else "/models/policy"
    for role in ("trainer", "reserved"):
        pod = pods[role]
        [init] = pod["initContainers"]
        assert init["name"] == children.FETCH_CONTAINER
        assert init["command"][:3] == ["python", "-m", "rlboost.models.fetch"]
        assert _flag(init["command"], "--dest") == expected_dir
        assert _flag(init["command"], "--termination-log") == init["terminationMessagePath"] == "/dev/termination-log"
        assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert init["image"] == pod["containers"][0]["image"]  # the service's image holds the fetcher
        assert _flag(pod["containers"][0]["command"], "--model-dir") == expected_dir
        volume = next(v for v in pod["volumes"] if v["name"] == "model")
        mounts = [m for c in (init, pod["containers"][0]) for m in c["volumeMounts"] if m["name"] == "model"]
        if source == "pvc":
            assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
            assert all(m["readOnly"] and m["mountPath"] == "/models/policy" for m in mounts)
        else:
            assert volume["emptyDir"] == {} and all(m["mountPath"] == "/models" for m in mounts)
        env = {e["name"]: e for e in init["env"]}
        if source == "huggingface":
            assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
        else:
            assert "HF_TOKEN" not in env
        assert "HF_TOKEN" not in {e["name"] for e in pod["containers"][0].get("env") or []}  # only the fetcher


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_spot_workers_get_no_model_and_pull_from_the_weight_server(source: str) -> None:
    spot = _pods(SOURCES[source])["spot"]
    assert "initContainers" not in spot
    assert not any(v["name"] == "model" for v in spot["volumes"])
    command = spot["containers"][0]["command"]
    assert _flag(command, "--model-dir") == ""
    assert _flag(command, "--weight-server") == "https://job1-weights.ns1.svc:8000"


def test_workers_wait_for_the_trainers_first_version_as_long_as_a_model_fetch_may_take() -> None:
    """The trainer publishes version 0 only after its own fetch-model init container (minutes for a large model; the
    cluster lane's spot worker gave up after the local 120 s and restarted while `tiny` was still being made)."""
    pods = _pods(SOURCES["huggingface"])
    for pool in ("reserved", "spot"):
        command = pods[pool]["containers"][0]["command"]
        assert float(_flag(command, "--startup-timeout")) == children.WORKER_STARTUP_TIMEOUT_S >= 1800


def test_a_path_model_is_refused_on_kubernetes_naming_the_field() -> None:
    with pytest.raises(SpecProblemError) as info:
        check_job({"model": {"source": "path", "path": "/models/qwen"}}, OperatorSettings())
    assert info.value.field == "model.source" and "'pvc'" in str(info.value)


def _pod(code: int, message: str, restarts: int = 0, last: bool = False) -> dict[str, Any]:
    terminated = {"exitCode": code, "message": message, "reason": "Error"}
    state = {"lastState": {"terminated": terminated}, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    if not last:
        state = {"state": {"terminated": terminated}}
    init = {"name": children.FETCH_CONTAINER, "restartCount": restarts, **state}
    return {"status": {"initContainerStatuses": [init]}}


def test_a_bad_source_fails_the_job_at_once_with_the_fetchers_line() -> None:
    line = "spec.model.repo: NotFound: repository 'a/b' not found on the Hub, or not readable: check the id\n"
    assert model_source.fetch_failure(_pod(3, line)) == model_source.ModelProblem(
        "repo", "NotFound", "repository 'a/b' not found on the Hub, or not readable: check the id"
    )
    assert model_source.fetch_failure(_pod(3, line, restarts=1, last=True)).field == "repo"


def test_an_unreachable_source_fails_the_job_after_some_tries() -> None:
    line = "spec.model.uri: Unreachable: cannot reach the object store for s3://m/q: timeout"
    assert model_source.fetch_failure(_pod(4, line, restarts=0)) is None
    assert model_source.fetch_failure(_pod(4, line, restarts=1, last=True)) is None
    assert model_source.fetch_failure(_pod(4, line, restarts=2, last=True)).reason == "Unreachable"


def test_a_crashed_fetcher_is_reported_from_its_logs_and_a_success_is_not() -> None:
    problem = model_source.fetch_failure(_pod(3, "Traceback (most recent call last):\nMemoryError\n"))
    assert problem.field == "source" and "exited with code 3: MemoryError" in problem.message
    assert model_source.fetch_failure(_pod(0, "")) is None
    assert model_source.fetch_failure({"status": {"initContainerStatuses": [{"name": "other"}]}}) is None


def test_model_failed_status_names_the_field() -> None:
    patch = status.model_failed_status("claimName", "ClaimNotFound", "no claim", {}, generation=4)
    assert patch["phase"] == "Failed"
    [cond] = patch["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("ModelReady", "False", "ClaimNotFound")
    assert cond["message"] == "spec.model.claimName: no claim" and cond["observedGeneration"] == 4
    cleared = model_source.without_precheck_failure([cond, {"type": "Valid", "reason": "SpecAccepted"}])
    assert [c["type"] for c in cleared] == ["Valid"]


def test_a_fetch_that_gave_up_ends_the_job_and_a_reconcile_keeps_it_failed() -> None:
    """A failed fetch is an end (spec.model cannot change): a later reconcile, as after an operator restart, keeps
    Failed instead of turning the job Pending and crash-looping the fetcher again; a missing claim is no end."""
    running = {"phase": "Running", "conditions": [status.condition("Valid", True, "SpecAccepted", "ok")]}
    patch = status.model_failed_status("uri", "NotFound", "s3://nope does not exist", running, generation=2, ended=True)
    merged = {**running, **patch}
    assert merged["phase"] == "Failed" and status.finished(merged)
    conds = {c["type"]: c for c in merged["conditions"]}
    assert (conds["ModelReady"]["status"], conds["ModelReady"]["reason"]) == ("False", "NotFound")
    assert conds["ModelReady"]["message"] == "spec.model.uri: s3://nope does not exist"
    assert (conds["Failed"]["status"], conds["Failed"]["reason"]) == ("True", "ModelUnavailable")
    assert (
        conds["Failed"]["message"].startswith("spec.model.uri: ")
        and "re-create the RLJob" in conds["Failed"]["message"]
    )
    assert "phase" not in status.reconcile_status(merged, 0, 2)
    precheck = status.model_failed_status("claimName", "ClaimNotFound", "no claim", running)
    assert not status.finished({**running, **precheck})


def _getter(objects: dict[tuple[str, str], dict[str, Any]]):
    async def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get((kind, name))

    return get


def _missing(model: dict[str, Any], objects: dict[tuple[str, str], dict[str, Any]]):
    spec = parse_job_spec({"model": model})
    return asyncio.run(model_source.missing_model_objects(_getter(objects), "ns1", spec.model))


def test_a_missing_claim_or_token_secret_is_found_before_children_are_made() -> None:
    assert _missing(SOURCES["pvc"], {}).field == "claimName"
    assert _missing(SOURCES["pvc"], {("PersistentVolumeClaim", "models"): {}}) is None
    assert _missing(SOURCES["huggingface"], {}).reason == "SecretNotFound"
    empty = {("Secret", "hf"): {"data": {"other": base64.b64encode(b"x").decode()}}}
    assert _missing(SOURCES["huggingface"], empty).reason == "SecretKeyMissing"
    good = {("Secret", "hf"): {"data": {"token": base64.b64encode(b"hf_abc").decode()}}}
    assert _missing(SOURCES["huggingface"], good) is None
    assert _missing(SOURCES["uri"], {}) is None and _missing(SOURCES["tiny"], {}) is None
