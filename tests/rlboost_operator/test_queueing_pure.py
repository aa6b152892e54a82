"""Unit tests of the pure parts of holding, suspending and queueing an RLJob (issue 30): the Workload the operator
makes for Kueue (one podSet per gang member, spot workers left to Kueue's deployment integration), how Kueue's
conditions are read, the ResourceFlavors' placement of admitted pods, the quota given back after an eviction; why a
job is held and the status of holding it; the RLJob's labels on every child; progress (12/12), the budget condition
and the per-job gauges; and the labels checked."""

from __future__ import annotations

from datetime import UTC, datetime

import jsonschema
import kubernetes_validate
import pytest
from prometheus_client import REGISTRY

from rlboost.spec import JobSpec, parse_job_spec
from rlboost.wire.events import JobDone, StepReport
from rlboost_operator import children, crd, holds, job_metrics, kueue, status
from rlboost_operator.checks import SpecProblemError, check_labels
from rlboost_operator.config import OperatorSettings
from rlboost_operator.queueing import adopt_spot_freely, kueue_status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
QUEUED = {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high", "team": "rl"}
GPU = {
    "trainer": {"ranks": 2, "gpusPerRank": 1},  # gpusPerRank > 1 is refused (issue 29)
    "algorithm": {"promptsPerStep": 4, "groupSize": 4},
    "rollout": {"reserved": {"replicas": 1, "gpusPerWorker": 1}, "spot": {"gpusPerWorker": 1, "maxReplicas": 8}},
}


def built(spec: dict | None = None, spot: int = 3, labels: dict | None = None) -> list[dict]:
    job_spec = parse_job_spec(spec or GPU)
    return children.build_children("j", "ns", job_spec, OperatorSettings(), spot, job_labels=labels or QUEUED)


def workload_of(objs: list[dict], priority: int | None = 1000) -> dict:
    return kueue.workload("j", "ns", objs, QUEUED, priority)


def admitted(wl: dict, flavors: dict[str, dict[str, str]] | None = None, **conds: str) -> dict:
    """`wl` as Kueue leaves it once it reserved quota and admitted it (the test plays Kueue's scheduler here)."""
    states = {"QuotaReserved": "True", "Admitted": "True", **conds}
    assignments = [{"name": n, "flavors": f} for n, f in (flavors or {}).items()]
    return {
        **wl,
        "status": {
            "admission": {"clusterQueue": "cq", "podSetAssignments": assignments},
            "conditions": [{"type": t, "status": s, "reason": t, "message": f"{t} {s}"} for t, s in states.items()],
        },
    }


def test_the_workload_asks_for_the_gang_but_not_the_spot_workers():
    wl = workload_of(built())
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert set(sets) == {"trainer", "rollout-manager", "weight-server", "nats", "reserved-workers"}
    assert sets["trainer"]["count"] == 2  # every rank in one podSet: Kueue admits a Workload whole
    trainer = sets["trainer"]["template"]["spec"]
    resources = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": "1"}}
    assert trainer["containers"] == [{"name": "trainer", "resources": resources}]
    assert trainer["initContainers"][0]["name"] == "fetch-model"  # its requests count too
    assert "affinity" in trainer and "command" not in trainer["containers"][0]  # what admission reads, no more
    assert wl["spec"]["queueName"] == "team-a" and wl["spec"]["active"] is True
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert wl["spec"]["priority"] == 1000
    assert wl["metadata"]["labels"]["rlboost.io/job"] == "j" and wl["metadata"]["labels"]["team"] == "rl"
    assert "priorityClassRef" not in workload_of(built(), priority=None)["spec"]


def test_the_workload_name_follows_what_it_asks_for_not_what_the_pods_run():
    name = workload_of(built())["metadata"]["name"]
    assert name.startswith("rljob-j-") and len(name) <= 253
    other_lr = {**GPU, "algorithm": {**GPU["algorithm"], "learningRate": 0.5}}  # the pods' command changes
    assert workload_of(built(other_lr))["metadata"]["name"] == name
    more_memory = {**GPU, "trainer": {**GPU["trainer"], "resources": {"memory": "64Gi"}}}
    assert workload_of(built(more_memory))["metadata"]["name"] != name
    assert workload_of(built(spot=7))["metadata"]["name"] == name  # the spot ask is not the Workload's


def test_kueue_conditions_read_as_admitted_evicted_or_waiting():
    wl = workload_of(built())
    waiting = kueue.admission({**wl, "status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "insufficient nvidia.com/gpu"}
    ]}})  # fmt: skip
    assert not waiting.admitted and waiting.waiting == "insufficient nvidia.com/gpu" and not kueue.runs(waiting)
    running = kueue.admission(admitted(wl, {"trainer": {"nvidia.com/gpu": "h100"}}))
    assert kueue.runs(running) and running.cluster_queue == "cq" and running.flavor_names() == {"h100"}
    evicted = kueue.admission(admitted(wl, Evicted="True"))
    assert evicted.evicted == ("Evicted", "Evicted True") and not kueue.runs(evicted)
    assert not kueue.runs(None)


def test_admitted_pods_get_their_flavors_node_labels_and_tolerations():
    objs = built()
    state = kueue.admission(admitted(workload_of(objs), {"trainer": {"nvidia.com/gpu": "h100", "cpu": "h100"}}))
    toleration = {"key": "pool", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}
    kueue.place(objs, state, {"h100": {"nodeLabels": {"pool": "h100"}, "tolerations": [toleration]}})
    by_name = {o["metadata"]["name"]: o for o in objs}
    pod = by_name["j-trainer"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "h100"} and toleration in pod["tolerations"]
    assert pod["tolerations"].count(toleration) == 1  # one flavor for two resources is applied once
    assert "nodeSelector" not in by_name["j-manager"]["spec"]["template"]["spec"]  # no flavor assigned to it
    for obj in objs:
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_the_quota_goes_back_after_an_eviction_and_the_end_finishes_the_workload():
    wl = admitted(workload_of(built()), Evicted="True")
    wl["status"]["conditions"][-1]["reason"] = "Preempted"
    patch = kueue.released_status(wl, T0)
    assert patch["admission"] is None
    conds = {c["type"]: c for c in patch["conditions"]}
    assert conds["QuotaReserved"]["status"] == "False" and conds["Admitted"]["status"] == "False"
    assert conds["Requeued"]["status"] == "True"  # after a preemption Kueue queues it again
    assert conds["Evicted"]["status"] == "True"  # Kueue resets it at the next admission, not the operator
    after = kueue.admission({**wl, "status": patch})
    assert not after.quota_reserved and after.evicted is not None
    done = kueue.finished_status(wl, True, "RLJob j Succeeded", T0)
    assert {c["type"]: c["status"] for c in done["conditions"]}["Finished"] == "True"


def test_spot_deployments_of_a_queued_job_are_owned_but_not_controlled():
    for obj in built():
        obj["metadata"]["ownerReferences"] = [{"kind": "RLJob", "name": "j", "controller": True}]
        adopt_spot_freely(obj, queued=True)
        spot = kueue.is_spot(obj)
        assert obj["metadata"]["ownerReferences"][0]["controller"] is (not spot), obj["metadata"]["name"]
    plain = built()[-1]
    plain["metadata"]["ownerReferences"] = [{"controller": True}]
    adopt_spot_freely(plain, queued=False)
    assert plain["metadata"]["ownerReferences"][0]["controller"] is True


def test_the_rljobs_labels_reach_every_child_and_pod_but_never_override_the_operators():
    objs = built(labels={**QUEUED, "app.kubernetes.io/component": "mine", "kubectl.kubernetes.io/x": "y"})
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["kueue.x-k8s.io/queue-name"] == "team-a" and labels["team"] == "rl", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/component"] != "mine" or obj["kind"] == "Secret"
        if obj["kind"] in ("Deployment", "StatefulSet"):
            pod = obj["spec"]["template"]["metadata"]["labels"]
            assert pod["kueue.x-k8s.io/priority-class"] == "high" and pod["rlboost.io/job"] == "j"
            assert pod["app.kubernetes.io/component"] != "mine"
            assert obj["spec"]["selector"]["matchLabels"].items() <= pod.items()
    assert children.job_labels({"kubectl.kubernetes.io/last-applied-configuration": "{}", "a": "b"}) == {"a": "b"}


def test_a_job_is_held_by_spec_suspend_and_by_kueue_until_admitted():
    wl = workload_of(built())
    assert holds.hold_for(JobSpec(), "", None) is None  # not queued
    assert holds.hold_for(JobSpec(suspend=True), "", None).reason == "Suspended"
    waiting = holds.hold_for(JobSpec(), "team-a", None)
    assert waiting.reason == "WaitingForAdmission" and "LocalQueue team-a" in waiting.message
    assert holds.hold_for(JobSpec(), "team-a", kueue.admission(admitted(wl))) is None
    assert holds.hold_for(JobSpec(suspend=True), "team-a", kueue.admission(admitted(wl))).reason == "Suspended"
    evicted = kueue.admission(admitted(wl, Evicted="True"))
    assert holds.hold_for(JobSpec(), "team-a", evicted).reason == "Preempted"
    released = kueue.admission({**wl, "status": kueue.released_status(admitted(wl, Evicted="True"), T0)})
    requeued = holds.hold_for(JobSpec(), "team-a", released)
    assert requeued.reason == "WaitingForAdmission" and "requeued after an eviction" in requeued.message


def step_report(step: int, seconds: tuple[float, float, float]) -> StepReport:
    """Step `step`'s report; `seconds`: its rollout, train and sync time."""
    rollout, train, sync = seconds
    return StepReport(
        step=step, weight_version=step + 1, weights_checksum="c", reward_mean=0.5, tokens=10,
        rollout_seconds=rollout, train_seconds=train, sync_seconds=sync,
    )  # fmt: skip


def _valid(patch: dict) -> None:
    """The patch against the CRD's status schema (a null in a merge patch deletes the field: left out here)."""
    jsonschema.Draft4Validator(crd.status_schema()).validate({k: v for k, v in patch.items() if v is not None})


def test_holding_suspending_and_resuming_status():
    running = {"phase": "Running", "workers": {"reserved": 1, "spot": 2}, "costPerHour": 12.0, "stepsCompleted": 5}
    hold = holds.Hold(holds.SPEC, "spec.suspend is true: set it to false to resume")
    suspending = holds.suspending_status(running, hold, T0, 3)
    assert suspending["suspension"]["state"] == "Suspending" and "phase" not in suspending  # still running
    stopped = {**running, **suspending, **holds.suspended_status({**running, **suspending}, hold, 5, T0, 3)}
    assert stopped["phase"] == "Suspended" and stopped["costPerHour"] == 0.0 and stopped["workers"]["spot"] == 0
    assert stopped["suspension"]["checkpointedSteps"] == 5 and stopped["suspension"]["reason"] == "Suspended"
    cond = {c["type"]: c for c in stopped["conditions"]}["Suspended"]
    assert cond["status"] == "True" and cond["observedGeneration"] == 3
    again = holds.suspended_status(stopped, holds.Hold(holds.WAITING, "waiting"), None, T0)
    assert again["suspension"]["checkpointedSteps"] == 5 and again["suspension"]["reason"] == "WaitingForAdmission"
    resumed = holds.resumed_status(stopped, T0)
    assert (
        resumed["phase"] == "Pending"
        and "after step 5" in {c["type"]: c for c in resumed["conditions"]}["Suspended"]["message"]
    )
    assert holds.suspended(stopped) and holds.never_ran(stopped) and holds.never_ran({})
    assert not holds.never_ran(running)
    cancelled = holds.cancelled_status({**running, **suspending}, T0)
    assert cancelled["suspension"]["state"] == "Cancelled" and "phase" not in cancelled
    assert {c["type"]: c for c in cancelled["conditions"]}["Suspended"]["reason"] == "Cancelled"
    for patch in (suspending, stopped, again, resumed, cancelled):
        _valid(patch)
    # A step report that arrives once the job is held does not make it Running again.
    report = step_report(5, seconds=(1, 1, 0))
    late = status.step_status(report, JobSpec(trainer={"gpusPerRank": 1}), {"reserved": 1}, stopped, T0)
    assert late["phase"] == "Suspended" and late["costPerHour"] == 0.0 and late["workers"]["reserved"] == 0
    assert late["progress"] == "6/60" and "estimatedRemainingSeconds" not in late  # its progress still counts


def test_progress_reads_steps_completed_against_the_total():
    spec = JobSpec(algorithm={"steps": 12})
    report = step_report(11, seconds=(2, 1, 1))
    last = status.step_status(report, spec, {}, {"phase": "Running"}, T0)
    assert (last["step"], last["progress"], last["progressPercentage"]) == (11, "12/12", 100)
    assert last["estimatedRemainingSeconds"] == 0
    mid = status.step_status(report.model_copy(update={"step": 2}), spec, {}, {}, T0)
    assert mid["progress"] == "3/12" and mid["progressPercentage"] == 25 and mid["estimatedRemainingSeconds"] == 36
    done = status.done_status(JobDone(ok=True, steps=12), {"stepsTotal": 12}, T0)
    assert done["progress"] == "12/12" and done["stepsCompleted"] == 12
    fresh = status.reconcile_status({}, 0, 1, T0, steps_total=12)
    assert fresh["progress"] == "0/12" and "estimatedRemainingSeconds" not in fresh
    for patch in (last, mid, done, fresh):
        _valid(patch)
    columns = {c["name"]: c["jsonPath"] for c in crd.printer_columns()}
    assert columns["Progress"] == ".status.progress" and "Step" not in columns


def test_spend_past_the_budget_sets_a_condition():
    spec = JobSpec(budget=1.0, trainer={"gpusPerRank": 1})
    report = step_report(0, seconds=(1, 0, 0))
    start = {"costSoFar": 0.9, "costPerHour": 3600.0, "updatedAt": status.now_iso(T0)}
    within = status.step_status(
        report, spec, {}, {**start, "updatedAt": status.now_iso(datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC))}, T0
    )
    assert {c["type"]: c["status"] for c in within["conditions"]}["BudgetExceeded"] == "False"
    over = status.step_status(report, spec, {}, start, datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC))
    cond = {c["type"]: c for c in over["conditions"]}["BudgetExceeded"]
    assert over["costSoFar"] == 1.9 and cond["status"] == "True" and "spec.budget 1.00 USD" in cond["message"]
    assert "BudgetExceeded" not in {
        c["type"] for c in status.step_status(report, JobSpec(), {}, start, T0)["conditions"]
    }


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"rljob_namespace": "ns", "rljob": "m", **labels})


def test_each_jobs_phase_cost_progress_and_restarts_are_gauges():
    rljob = {
        "spec": {"budget": 50, "algorithm": {"steps": 12}},
        "status": {
            "phase": "Running",
            "costSoFar": 12.5,
            "costPerHour": 3.0,
            "stepsCompleted": 4,
            "stepsTotal": 12,
            "trainerRestarts": 2,
        },
    }
    job_metrics.observe("ns", "m", rljob)
    assert _sample("rlboost_operator_job_phase", phase="Running") == 1.0
    assert _sample("rlboost_operator_job_phase", phase="Suspended") == 0.0
    assert _sample("rlboost_operator_job_cost_usd") == 12.5 and _sample("rlboost_operator_job_cost_per_hour_usd") == 3.0
    assert _sample("rlboost_operator_job_budget_usd") == 50.0
    assert _sample("rlboost_operator_job_steps_completed") == 4 and _sample("rlboost_operator_job_steps_total") == 12
    assert _sample("rlboost_operator_trainer_restarts") == 2 and _sample("rlboost_operator_trainer_backoff_limit") == 3
    job_metrics.observe("ns", "m", {"spec": {}, "status": {"phase": "Suspended"}})
    assert _sample("rlboost_operator_job_phase", phase="Suspended") == 1.0
    assert _sample("rlboost_operator_job_budget_usd") is None  # no budget any more: no series
    job_metrics.forget("ns", "m")
    assert (
        _sample("rlboost_operator_job_phase", phase="Suspended") is None
        and _sample("rlboost_operator_job_cost_usd") is None
    )


def test_kueue_labels_must_name_kueue_objects():
    check_labels(QUEUED)
    check_labels(None)
    for key in ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class"):
        with pytest.raises(SpecProblemError) as err:
            check_labels({key: "Team_A"})
        assert err.value.path == f'metadata.labels["{key}"]' and "'Team_A'" in str(err.value)
    invalid = status.invalid_status('metadata.labels["kueue.x-k8s.io/queue-name"]', "bad", None, T0)
    assert invalid["conditions"][0]["message"].startswith('metadata.labels["kueue.x-k8s.io/queue-name"]: bad')


def test_the_status_names_the_workload():
    state = kueue.admission(admitted(workload_of(built())))
    assert kueue_status(state, "team-a") == {
        "workload": state.name,
        "queueName": "team-a",
        "clusterQueue": "cq",
        "admitted": True,
    }
    assert kueue_status(None, "") is None
    _valid({"kueue": kueue_status(state, "team-a")})
