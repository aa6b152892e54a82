"""Unit tests of the pure decisions behind an RLJob's lifecycle: when a job has ended, the status patches of its
end and of its reconciles, trainer failures and the back-off limit, the trainer's resume flags, scaling to zero,
the config hash that rolls pods, and PVC retention."""

from __future__ import annotations

from datetime import UTC, datetime

import kubernetes_validate
import pytest

from rlboost.options import TrainerOptions
from rlboost.spec import JobSpec, parse_job_spec
from rlboost.wire.events import JobDone
from rlboost_operator import children, status
from rlboost_operator.config import OperatorSettings
from rlboost_operator.lifecycle import TrainerFailures

K8S_VERSION = "1.30.0"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ended(ok: bool = True) -> dict:
    previous = {"phase": "Running", "conditions": [status.condition("Valid", True, "SpecAccepted", "ok", T0)]}
    return {**previous, **status.done_status(JobDone(ok=ok, steps=3), previous, T0)}


def test_a_job_has_ended_after_done_or_back_off_but_not_after_an_invalid_spec():
    assert status.finished(ended(True)) and status.finished(ended(False))
    backoff = status.backoff_status(4, 3, {"phase": "Running"}, T0)
    assert status.finished(backoff)
    assert not status.finished(status.invalid_status("trainer.ranks", "too many"))  # fixing the spec runs it
    assert not status.finished({"phase": "Running"}) and not status.finished({})


def test_reconcile_status_keeps_an_ended_job_ended_and_revives_a_fixed_one():
    new = status.reconcile_status({}, spot_desired=2, generation=1, now=T0)
    assert new["phase"] == "Pending" and new["workers"]["spotDesired"] == 2 and new["observedGeneration"] == 1
    assert new["startedAt"] == status.now_iso(T0)
    fixed = status.reconcile_status(status.invalid_status("trainer.ranks", "x", now=T0), 1, 2, T0)
    assert fixed["phase"] == "Pending"
    assert [(c["type"], c["status"]) for c in fixed["conditions"]] == [("Valid", "True")]
    for previous in (ended(True), ended(False)):
        patch = status.reconcile_status(previous, 0, 3, T0)
        assert "phase" not in patch  # Succeeded / Failed stays
        assert status.finished({**previous, **patch})
    assert "phase" not in status.reconcile_status({"phase": "Running"}, 1, 1, T0)


def test_an_invalid_edit_of_an_ended_job_keeps_how_it_ended():
    previous = ended(True)
    patch = status.invalid_status("trainer.backend", "nccl needs GPUs", previous, T0)
    merged = {**previous, **patch}
    assert merged["phase"] == "Succeeded" and status.finished(merged)
    assert {c["type"]: c["status"] for c in merged["conditions"]} == {"Valid": "False", "Complete": "True"}


def test_stopped_status_zeroes_workers_and_cost_and_says_what_is_kept():
    previous = {**ended(True), "workers": {"reserved": 1, "spot": 3, "spotDesired": 3}, "costPerHour": 45.0}
    patch = status.stopped_status(previous, "JobFinished", T0, generation=2)
    assert patch["workers"] == {"reserved": 0, "spot": 0, "spotDesired": 0} and patch["costPerHour"] == 0.0
    stopped = patch["conditions"][-1]
    assert (stopped["type"], stopped["status"], stopped["reason"]) == ("Stopped", "True", "JobFinished")
    assert "checkpoints (PVCs)" in stopped["message"] and stopped["observedGeneration"] == 2
    assert {c["type"] for c in patch["conditions"]} == {"Valid", "Complete", "Stopped"}


def pod(restarts: int | None, last_exit: int | None = None, name: str = "trainer") -> dict:
    cs: dict = {"name": name}
    if restarts is not None:
        cs["restartCount"] = restarts
    if last_exit is not None:
        cs["lastState"] = {"terminated": {"exitCode": last_exit}}
    return {"status": {"containerStatuses": [cs]}}


@pytest.mark.parametrize(
    ("trainer_pod", "failures"),
    [
        (pod(0), 0),
        (pod(3, last_exit=137), 3),  # killed (OOM, liveness): failures
        (pod(3, last_exit=0), 2),  # the last restart followed a clean exit: the trainer finished, not a failure
        (pod(1, last_exit=0), 0),
        (pod(5, last_exit=1, name="sidecar"), 0),  # another container's restarts are not the trainer's
        ({"status": {}}, 0),  # not started yet
        (pod(None), 0),
    ],
)
def test_trainer_failures_from_the_pods_restart_count(trainer_pod, failures):
    assert status.trainer_failures(trainer_pod) == failures


def test_backoff_limit_tolerates_that_many_restarts_and_names_count_and_limit():
    assert not status.backoff_exceeded(3, 3) and status.backoff_exceeded(4, 3)
    assert status.backoff_exceeded(1, 0) and not status.backoff_exceeded(0, 0)
    patch = status.backoff_status(4, 3, {"phase": "Running"}, T0, generation=5)
    failed = patch["conditions"][-1]
    assert patch["phase"] == "Failed"
    assert (failed["type"], failed["reason"], failed["observedGeneration"]) == ("Failed", "BackoffLimitExceeded", 5)
    assert "restarted 4 times" in failed["message"] and "trainer.backoffLimit (3)" in failed["message"]


def test_the_most_failures_of_any_rank_count_once_per_job():
    trainers = TrainerFailures()
    trainers.seen("ns", "j-trainer-0", "j", 2)
    trainers.seen("ns", "j-trainer-1", "j", 3)
    trainers.seen("ns", "k-trainer-0", "k", 9)
    trainers.seen("other", "j-trainer-0", "j", 7)
    assert trainers.most("ns", "j") == 3 and trainers.most("ns", "none") == 0


def test_backoff_limit_is_a_bounded_spec_field_with_a_default():
    assert JobSpec().trainer.backoff_limit == 3
    assert parse_job_spec({"trainer": {"backoffLimit": 0}}).trainer.backoff_limit == 0
    with pytest.raises(ValueError, match="trainer.backoffLimit"):
        parse_job_spec({"trainer": {"backoffLimit": -1}})


def _by_kind(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_every_service_is_created_before_any_workload():
    """Helm's install order: a pod starts with its peers' Services in place (the cluster lane's trainer once found
    no DNS name for a manager whose Deployment was created just before its Service)."""
    kinds = [o["kind"] for o in children.build_children("j", "ns", JobSpec(), OperatorSettings(), 2)]
    first_workload = min(i for i, k in enumerate(kinds) if k in {"Deployment", "StatefulSet"})
    assert kinds.count("Service") == 4 and "Service" not in kinds[first_workload:]


def test_the_trainer_always_resumes_from_checkpoints_on_its_volume():
    objs = _by_kind(children.build_children("j", "ns", JobSpec(), OperatorSettings(), 1))
    sts = objs[("StatefulSet", "j-trainer")]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    cmd = container["command"]
    assert cmd[cmd.index("--checkpoint-dir") + 1] == children.CHECKPOINT_DIR and "--resume" in cmd
    assert any(children.CHECKPOINT_DIR.startswith(m["mountPath"] + "/") for m in container["volumeMounts"])
    # The flags parse as the trainer's own options do (the rendering is the trainer's model's).
    opts = TrainerOptions.from_argv(cmd[3:])
    assert opts.resume and opts.checkpoint_dir == children.CHECKPOINT_DIR


def test_an_ended_job_has_every_workload_at_zero_and_keeps_the_rest():
    spec = JobSpec()
    running = children.build_children("j", "ns", spec, OperatorSettings(), 2)
    stopped = children.build_children("j", "ns", spec, OperatorSettings(), 0, finished=True)
    scaled = {(o["kind"], o["metadata"]["name"]) for o in running if o["kind"] in ("Deployment", "StatefulSet")}
    assert scaled == set(children.workloads("j"))  # what the end of a job patches is every workload
    assert all(o["spec"]["replicas"] == 0 for o in stopped if (o["kind"], o["metadata"]["name"]) in scaled)
    assert all(o["spec"]["replicas"] > 0 for o in running if (o["kind"], o["metadata"]["name"]) in scaled)
    assert [(o["kind"], o["metadata"]["name"]) for o in stopped] == [
        (o["kind"], o["metadata"]["name"]) for o in running
    ]
    for obj in stopped:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _hashes(spec: JobSpec) -> dict[str, str]:
    objs = children.build_children("j", "ns", spec, OperatorSettings(), 1)
    return {
        o["metadata"]["name"]: o["spec"]["template"]["metadata"]["annotations"][children.CONFIG_HASH]
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet") and "annotations" in o["spec"]["template"]["metadata"]
    }


def test_config_hash_rolls_pods_when_what_they_run_changes_and_only_then():
    base = _hashes(JobSpec())
    # the job's NATS runs no job file: a spec edit must not restart it (and cut every service's connection)
    assert set(base) == {name for _, name in children.workloads("j")} - {"j-nats"}
    assert _hashes(JobSpec()) == base  # deterministic
    rolled = _hashes(parse_job_spec({"algorithm": {"learningRate": 0.01}}))  # in the job file every pod mounts
    assert all(rolled[name] != base[name] for name in base)
    for operator_only in (
        {"prices": {"spotPerGpuHour": 1.0}},
        {"retention": {"pvcs": "Delete"}},
        {"trainer": {"backoffLimit": 9}},
    ):
        assert _hashes(parse_job_spec(operator_only)) == base, operator_only
    # What the containers run counts too: another image is another pod.
    other = children.build_children("j", "ns", JobSpec(), OperatorSettings(image_tag="9.9.9"), 1)
    assert (
        next(o for o in other if o["kind"] == "StatefulSet")["spec"]["template"]["metadata"]["annotations"][
            children.CONFIG_HASH
        ]
        != base["j-trainer"]
    )


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_pvc_retention_follows_the_spec(policy):
    spec = parse_job_spec({"retention": {"pvcs": policy}})
    objs = _by_kind(children.build_children("j", "ns", spec, OperatorSettings(), 1))
    sts = objs[("StatefulSet", "j-trainer")]["spec"]
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": policy, "whenScaled": "Retain"}
    pvc = objs[("PersistentVolumeClaim", "j-weights")]
    # Retain: no owner (an empty list, so a patch also drops an owner set under Delete); Delete: adopted.
    assert children.adopted(pvc) == (policy == "Delete")
    assert ("ownerReferences" in pvc["metadata"]) == (policy == "Retain")
    assert all(children.adopted(o) for o in objs.values() if o["kind"] != "PersistentVolumeClaim")
    for obj in objs.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert JobSpec().retention.pvcs == "Retain"  # the safe default: checkpoints outlive a mistaken delete
