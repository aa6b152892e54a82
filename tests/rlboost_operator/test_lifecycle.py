"""An RLJob's lifecycle against the operator (kmock as the API server, kopf under KopfRunner, a real nats-server):
the end of a job scales it to zero for good, a trainer that keeps dying fails the job, and no RLJob carries a
finalizer, so one deletes even when no operator runs.

kmock runs no controllers and no kubelet: the tests write the trainer pod's restart counts as the kubelet would,
and read the replicas the operator asked for rather than pods going away. kmock does honour finalizers (an
object with one is only marked for deletion), which is what the Terminating test relies on.
"""

from __future__ import annotations

from typing import Any

from kopf.testing import KopfRunner

from rlboost.wire.events import JobDone, subject
from rlboost_operator import children
from tests.helpers import wait_until
from tests.rlboost_operator.conftest import operator_memo
from tests.rlboost_operator.test_operator import NS, _publish, rljob, status_of

ARGS = ["run", "-A", "--standalone", "-m", "rlboost_operator.handlers"]


def replicas(api, job: str) -> dict[str, int | None]:
    """The replicas asked of each of the job's workloads (None: not created)."""
    out = {}
    for kind, name in children.workloads(job):
        obj = api.get(kind, NS, name)
        out[name] = obj["spec"]["replicas"] if obj else None
    return out


def all_zero(api, job: str) -> bool:
    return set(replicas(api, job).values()) == {0}


def condition(api, job: str, kind: str) -> dict[str, Any]:
    return next((c for c in status_of(api, job).get("conditions") or [] if c["type"] == kind), {})


def reasons(api) -> set[str]:
    return {e.get("reason") for e in api.list("Event", NS)}


def _start(api, monkeypatch, nats_url: str) -> KopfRunner:
    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", nats_url)
    return KopfRunner(ARGS, timeout=30)


def test_done_scales_the_job_to_zero_and_it_stays_there_after_an_edit_and_an_operator_restart(
    kube_api, job_nats, monkeypatch
):
    api = kube_api
    with _start(api, monkeypatch, job_nats.url) as first:
        wait_until(lambda: api.watched("rljobs"), timeout=20, what="the operator's watch")
        api.create("RLJob", rljob("finisher"))
        wait_until(lambda: status_of(api, "finisher").get("phase") == "Pending", timeout=20, what="Pending")
        job_nats.start(api, NS, "finisher")
        assert 0 not in replicas(api, "finisher").values()
        done = (subject(NS, "finisher", "done"), JobDone(ok=True, steps=60).model_dump_json().encode())

        def ended() -> bool:  # the subscription is made asynchronously: publish until the job ends
            _publish(job_nats, [done])
            return status_of(api, "finisher").get("phase") == "Succeeded"

        wait_until(ended, timeout=20, interval=0.3, what="phase Succeeded")
        wait_until(lambda: condition(api, "finisher", "Stopped").get("status") == "True", timeout=20, what="Stopped")
        assert all_zero(api, "finisher"), replicas(api, "finisher")
        st = status_of(api, "finisher")
        assert st["workers"] == {**st["workers"], "reserved": 0, "spot": 0, "spotDesired": 0}
        assert st["costPerHour"] == 0.0 and condition(api, "finisher", "Stopped")["reason"] == "JobFinished"
        assert condition(api, "finisher", "Complete")["status"] == "True"
        wait_until(lambda: {"JobSucceeded", "ScaledToZero"} <= reasons(api), timeout=20, what="the Events")
        for kind, name in [
            ("ConfigMap", "finisher-config"),
            ("Secret", "finisher-credentials"),
            ("PersistentVolumeClaim", "finisher-weights"),
        ]:
            assert api.get(kind, NS, name) is not None, (kind, name)

        # A spec edit of the ended job: the children follow it (a new config hash), at zero replicas.
        spot = lambda: api.get("Deployment", NS, "finisher-workers-spot")["spec"]["template"]  # noqa: E731
        before = spot()["metadata"]["annotations"][children.CONFIG_HASH]
        api.patch("RLJob", NS, "finisher", {"spec": {"algorithm": {"learningRate": 0.01}}})
        wait_until(
            lambda: spot()["metadata"]["annotations"][children.CONFIG_HASH] != before, timeout=20, what="new hash"
        )
        assert all_zero(api, "finisher") and status_of(api, "finisher")["phase"] == "Succeeded"
    assert first.exception is None, first.output

    # While no operator runs, something scales the manager up again; the next operator puts it back to zero.
    api.patch("Deployment", NS, "finisher-manager", {"spec": {"replicas": 1}})
    with _start(api, monkeypatch, job_nats.url) as second:
        wait_until(lambda: all_zero(api, "finisher"), timeout=20, what="every workload back at zero")
        assert status_of(api, "finisher")["phase"] == "Succeeded"
    assert second.exception is None, second.output


def trainer_pod(job: str, restarts: int, last_exit: int) -> dict[str, Any]:
    """A trainer rank's pod as the kubelet reports it after `restarts` restarts, the last exit `last_exit`."""
    terminated = {"exitCode": last_exit, "reason": "Error" if last_exit else "Completed"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job}-trainer-0",
            "namespace": NS,
            "resourceVersion": "1",
            "labels": children.labels(job, "trainer"),
        },
        "spec": {"nodeName": "node-a"},
        "status": {
            "containerStatuses": [
                {"name": "trainer", "restartCount": restarts, "lastState": {"terminated": terminated}}
            ]
        },
    }


def test_a_trainer_restarting_past_its_backoff_limit_fails_the_job_and_scales_it_to_zero(operator):
    api = operator
    api.create("RLJob", rljob("crashy", {"trainer": {"backoffLimit": 1}}))
    wait_until(lambda: status_of(api, "crashy").get("phase") == "Pending", timeout=20, what="Pending")
    api.create("Pod", trainer_pod("crashy", restarts=1, last_exit=1))  # at the limit: tolerated
    api.patch("Pod", NS, "crashy-trainer-0", {"status": trainer_pod("crashy", 2, 1)["status"]})  # one more
    wait_until(lambda: status_of(api, "crashy").get("phase") == "Failed", timeout=20, what="phase Failed")
    failed = condition(api, "crashy", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded", failed
    # The count that crossed the limit, not the one at it (an end is final: the first one is kept).
    assert "restarted 2 times" in failed["message"] and "trainer.backoffLimit (1)" in failed["message"]
    wait_until(lambda: all_zero(api, "crashy"), timeout=20, what="every workload at zero")
    assert condition(api, "crashy", "Stopped")["reason"] == "BackoffLimitExceeded"
    wait_until(lambda: "BackoffLimitExceeded" in reasons(api), timeout=20, what="the Warning Event")


def test_a_clean_exit_is_no_failure(operator):
    """restartCount 2 after a crash and then a clean exit (the trainer finished) counts 1: within backoffLimit 1."""
    api = operator
    api.create("RLJob", rljob("clean", {"trainer": {"backoffLimit": 1}}))
    wait_until(lambda: status_of(api, "clean").get("phase") == "Pending", timeout=20, what="Pending")
    api.create("Pod", trainer_pod("clean", restarts=2, last_exit=0))
    # A second job's pod event, handled after the first one: by then "clean" would have failed.
    api.create("RLJob", rljob("witness", {"trainer": {"backoffLimit": 0}}))
    wait_until(lambda: status_of(api, "witness").get("phase") == "Pending", timeout=20, what="witness Pending")
    api.create("Pod", trainer_pod("witness", restarts=1, last_exit=1))
    wait_until(lambda: status_of(api, "witness").get("phase") == "Failed", timeout=20, what="witness Failed")
    assert status_of(api, "clean")["phase"] == "Pending"


def finalizers(api, name: str) -> list[str]:
    return (api.get("RLJob", NS, name) or {}).get("metadata", {}).get("finalizers") or []


def test_rljobs_carry_no_finalizer_and_delete_when_no_operator_runs(kube_api, job_nats, monkeypatch):
    """Before, kopf put `rlboost.io/operator` on every RLJob (for the status daemon and the spot timer): with the
    operator uninstalled, a deleted RLJob stayed in Terminating. Now none is added, and an older operator's is
    removed; the links to each job's NATS (and its status subscriptions) are the operator's own, dropped when the
    RLJob goes."""
    api = kube_api
    legacy = rljob("legacy")
    legacy["metadata"]["finalizers"] = ["rlboost.io/operator"]  # as an older operator left it
    with _start(api, monkeypatch, job_nats.url) as runner:
        wait_until(lambda: api.watched("rljobs"), timeout=20, what="the operator's watch")
        memo = operator_memo()  # the operator runs in this process (KopfRunner's thread)
        api.create("RLJob", rljob("plain"))
        api.create("RLJob", legacy)
        for name in ("plain", "legacy"):
            wait_until(lambda n=name: status_of(api, n).get("phase") == "Pending", timeout=20, what=f"{name} Pending")
            wait_until(lambda n=name: (NS, n) in memo.links, timeout=20, what=f"{name}'s NATS link")
        wait_until(lambda: finalizers(api, "legacy") == [], timeout=20, what="the old finalizer removed")
        assert finalizers(api, "plain") == []
        api.delete("RLJob", NS, "legacy")
        assert api.get("RLJob", NS, "legacy") is None
        wait_until(lambda: (NS, "legacy") not in memo.links, timeout=20, what="legacy forgotten")
        assert (NS, "legacy") not in memo.stream.subscriptions
        assert (NS, "legacy") not in memo.jobs and (NS, "plain") in memo.jobs
    assert runner.exception is None, runner.output
    api.delete("RLJob", NS, "plain")  # no operator runs
    assert api.get("RLJob", NS, "plain") is None  # gone, not Terminating


def test_a_new_rljob_under_an_old_name_ignores_the_old_jobs_kept_done(operator, job_nats):
    """JetStream keeps the newest `done` of a job name for a week; an RLJob created again under that name must
    not start out Succeeded (and scaled to zero): kept messages older than its creationTimestamp are skipped."""
    from datetime import UTC, datetime, timedelta

    from rlboost_operator.notices import status_stream_config

    api = operator
    reborn = rljob("reborn")
    created = datetime.now(UTC) + timedelta(seconds=2)  # the API server's clock: after the old `done` below
    reborn["metadata"]["creationTimestamp"] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    api.create("RLJob", reborn)
    wait_until(lambda: status_of(api, "reborn").get("phase") == "Pending", timeout=20, what="Pending")
    job_nats.start(api, NS, "reborn")
    _add_stream(job_nats, status_stream_config())  # kept from the start, whenever the operator subscribes
    old_done = JobDone(ok=True, steps=60).model_dump_json().encode()
    _publish(job_nats, [(subject(NS, "reborn", "done"), old_done)])  # an earlier "reborn" ended
    new_done = JobDone(ok=False, steps=1, error="second life").model_dump_json().encode()

    def ended() -> bool:
        _publish(job_nats, [(subject(NS, "reborn", "done"), new_done)])
        return status_of(api, "reborn").get("phase") in ("Succeeded", "Failed")

    wait_until(ended, timeout=20, interval=0.3, what="the new job's end")
    # Had the old `done` been taken, the job would be Succeeded: the first end is kept.
    assert status_of(api, "reborn")["phase"] == "Failed"
    assert "second life" in condition(api, "reborn", "Failed")["message"]


def _add_stream(job_nats, config) -> None:
    """Make the status stream as the operator would (as its NATS user)."""
    import asyncio

    import nats

    async def add() -> None:
        nc = await nats.connect(job_nats.url, **job_nats.options("operator"))
        try:
            await nc.jetstream().add_stream(config)
        finally:
            await nc.close()

    asyncio.run(add())


def test_a_new_operator_carries_on_with_the_spot_back_off_kept_in_the_status(kube_api, job_nats, monkeypatch):
    """Autoscaler sizing backing off (pods stayed unschedulable): a restarted operator (or a new leader) takes the
    state up from status.workers.spotAsk and keeps the shrunk ask until the same retry time, instead of asking for
    maxReplicas again and waiting out the pending bound from scratch."""
    from tests.rlboost_operator.test_operator import spot_pod, spot_replicas

    monkeypatch.setenv("RLBOOST_OPERATOR_SPOT_PENDING_TIMEOUT_S", "2")
    monkeypatch.setenv("RLBOOST_OPERATOR_SPOT_RETRY_BACKOFF_S", "600")
    api = kube_api
    for name, node in [("a", "spot-a"), ("b", "spot-a"), ("c", None), ("d", None)]:
        api.create("Pod", spot_pod("ask", f"ask-workers-spot-{name}", node))
    spec = {"rollout": {"spot": {"minReplicas": 0, "maxReplicas": 4, "gpusPerWorker": 1, "sizing": "autoscaler"}}}
    with _start(api, monkeypatch, job_nats.url) as first:
        wait_until(lambda: api.watched("pods"), timeout=20, what="the operator's watch")
        api.create("RLJob", rljob("ask", spec))
        wait_until(lambda: spot_replicas(api, "ask") == 3, timeout=20, what="the ask shrunk to 2 placed + 1 probe")
        backing_off = lambda: status_of(api, "ask")["workers"].get("spotReason") == "SpotPendingBackoff"  # noqa: E731
        wait_until(backing_off, timeout=20, what="the back-off in the status")
    assert first.exception is None, first.output
    saved = status_of(api, "ask")["workers"]["spotAsk"]
    assert saved["retryAt"] and saved["backoffSeconds"] == 1200

    api.patch("Deployment", NS, "ask-workers-spot", {"spec": {"replicas": 9}})  # whatever the next operator writes
    with _start(api, monkeypatch, job_nats.url) as second:
        wait_until(lambda: spot_replicas(api, "ask") != 9, timeout=20, what="the new operator's spot ask")
        assert spot_replicas(api, "ask") == 3, "the new operator asked for the maximum again"
        wait_until(lambda: backing_off() and status_of(api, "ask")["workers"]["spotAsk"] == saved, timeout=10)
    assert second.exception is None, second.output
