"""The operator end to end against a Kubernetes API served by kmock (real HTTP on loopback),
kopf running it under KopfRunner, and a real nats-server for notices and step reports (the job's own NATS,
configured from the Secrets the operator made: conftest.JobNats).

kmock runs no controllers: Pods are created by the tests, garbage collection is checked through
ownerReferences, and Deployment readiness is written by the tests as the kubelet would.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import nats
import pytest
from prometheus_client import REGISTRY

from rlboost.auth.credentials import TICKET_KEY, WORKER_IDENTITY_CLUSTER, generate_items
from rlboost.wire.events import DONE, NODES, STEPS, JobDone, PreemptionNotice, StepReport
from rlboost_operator import children
from tests.helpers import wait_until
from tests.rlboost_operator.conftest import operator_memo

NS = "team-a"


def rljob(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "rlboost.io/v1alpha1",
        "kind": "RLJob",
        # kmock assigns no resourceVersion; kopf's JSON patches test for one.
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": spec
        if spec is not None
        else {"rollout": {"spot": {"minReplicas": 1, "maxReplicas": 3, "gpusPerWorker": 1}}},
    }


def spot_node(name: str, gpus: int = 2, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"cloud.google.com/gke-spot": "true"}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def status_of(api, name: str) -> dict[str, Any]:
    return (api.get("RLJob", NS, name) or {}).get("status") or {}


def spot_replicas(api, job: str) -> int | None:
    dep = api.get("Deployment", NS, f"{job}-workers-spot")
    return dep["spec"]["replicas"] if dep else None


def test_create_builds_adopted_children_and_update_patches_them(operator):
    api = operator
    api.create("RLJob", rljob("demo"))
    wait_until(lambda: api.get("Deployment", NS, "demo-workers-spot"), timeout=20, what="the spot Deployment")
    for kind, name in [
        ("ConfigMap", "demo-config"),
        ("StatefulSet", "demo-trainer"),
        ("Service", "demo-trainer"),
        ("Deployment", "demo-manager"),
        ("Service", "demo-manager"),
        ("Deployment", "demo-weights"),
        ("Service", "demo-weights"),
        ("Deployment", "demo-workers-reserved"),
        ("Secret", "demo-credentials"),
        ("Secret", "demo-nats-config"),
        ("Deployment", "demo-nats"),
        ("Service", "demo-nats"),
        ("NetworkPolicy", "demo-pods"),
    ]:
        child = wait_until(lambda k=kind, n=name: api.get(k, NS, n), timeout=10, what=f"{kind} {name}")
        owners = child["metadata"].get("ownerReferences") or []
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [("RLJob", "demo", "uid-demo")], (kind, name)
    # spec.retention.pvcs defaults to Retain: the weight-server's PVC outlives the RLJob.
    assert api.get("PersistentVolumeClaim", NS, "demo-weights")["metadata"]["ownerReferences"] == []
    # No spot nodes yet: the spot pool sits at its minimum.
    assert spot_replicas(api, "demo") == 1
    assert wait_until(lambda: status_of(api, "demo").get("phase") == "Pending", what="phase Pending")

    sts = api.get("StatefulSet", NS, "demo-trainer")
    assert sts["spec"]["replicas"] == 1
    credentials = api.get("Secret", NS, "demo-credentials")["data"]
    assert {"token-worker", "nats-operator.pass", "manifest.key", "ca.crt", "tls-nats.key"} <= set(credentials)
    api.patch("RLJob", NS, "demo", {"spec": {"trainer": {"ranks": 2}}})
    wait_until(lambda: api.get("StatefulSet", NS, "demo-trainer")["spec"]["replicas"] == 2, timeout=20, what="2 ranks")
    env = {
        e["name"]: e.get("value")
        for e in api.get("StatefulSet", NS, "demo-trainer")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["WORLD_SIZE"] == "2"
    assert "ranks: 2" in api.get("ConfigMap", NS, "demo-config")["data"]["job.yaml"]
    # The credentials were made once: the reconcile of the edit kept them (running pods hold them).
    assert api.get("Secret", NS, "demo-credentials")["data"] == credentials


def test_an_older_jobs_credentials_get_the_items_added_since_and_keep_the_rest(operator):
    """A job whose credentials Secret was made before `manager-ticket.key` existed: the operator adds that item
        (the manager's pods mount it), writes the cluster's keys (worker-identity.json) as for every job, and leaves
    every other item as it was (running pods hold them)."""
    api = operator
    items = {k: v for k, v in generate_items().items() if k != TICKET_KEY}
    api.create("Secret", children.credentials_secret("older", NS, items))
    api.create("RLJob", rljob("older"))

    def added() -> dict[str, str] | None:
        data = api.get("Secret", NS, "older-credentials")["data"]
        return data if TICKET_KEY in data else None

    data = wait_until(added, timeout=20, what="the ticket key added to the older Secret")
    kept = {k: v for k, v in data.items() if k not in (TICKET_KEY, WORKER_IDENTITY_CLUSTER)}  # the cluster's keys too
    assert kept == children.credentials_secret("older", NS, items)["data"]


def test_spot_nodes_appearing_and_vanishing_scale_the_spot_workers(operator):
    api = operator
    api.create("RLJob", rljob("scaler"))
    wait_until(lambda: spot_replicas(api, "scaler") == 1, timeout=20, what="spot workers at min")
    api.create("Node", spot_node("spot-a", gpus=2))
    wait_until(lambda: spot_replicas(api, "scaler") == 2, timeout=20, what="2 spot workers")
    api.create("Node", spot_node("spot-b", gpus=4))
    wait_until(lambda: spot_replicas(api, "scaler") == 3, timeout=20, what="spot workers capped at max")
    api.delete("Node", None, "spot-b")
    api.delete("Node", None, "spot-a")
    wait_until(lambda: spot_replicas(api, "scaler") == 1, timeout=20, what="spot workers back to min")
    # The status and the event are written after the Deployment: wait for them, do not race them.
    wait_until(lambda: status_of(api, "scaler")["workers"]["spotDesired"] == 1, timeout=20, what="status at min")
    wait_until(lambda: "SpotScaled" in {e.get("reason") for e in api.list("Event", NS)}, timeout=20, what="event")


@pytest.fixture
def short_spot_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autoscaler sizing's pending bound and back-off in seconds, not minutes (read when the operator starts).
    The back-off does not double (its maximum is its start, the doubling is test_spot_ask's): the shrink and retry
    repeat alike every 4 s, so a test slowed by the machine's load sees the same status in whichever round it reads."""
    monkeypatch.setenv("RLBOOST_OPERATOR_SPOT_PENDING_TIMEOUT_S", "2")
    monkeypatch.setenv("RLBOOST_OPERATOR_SPOT_RETRY_BACKOFF_S", "2")
    monkeypatch.setenv("RLBOOST_OPERATOR_SPOT_RETRY_BACKOFF_MAX_S", "2")


def spot_pod(job: str, name: str, node: str | None) -> dict[str, Any]:
    """A spot worker Pod as the scheduler leaves it: on `node`, or unschedulable since long ago."""
    meta = {
        "name": name,
        "namespace": NS,
        "resourceVersion": "1",
        "labels": {"rlboost.io/job": job, "rlboost.io/pool": "spot", "rlboost.io/component": "rollout-worker"},
    }
    if node:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "lastTransitionTime": "2020-01-01T00:00:00Z",
        "message": "0/3 nodes are available",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {},
        "status": {"phase": "Pending", "conditions": [unschedulable]},
    }


def events(api, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.list("Event", NS) if e.get("reason") == reason]


def backing_off(workers: dict[str, Any]) -> dict[str, Any] | None:
    return workers if workers.get("spotReason") == "SpotPendingBackoff" else None


def test_autoscaled_spot_pool_asks_for_max_shrinks_on_pending_pods_and_retries(short_spot_bounds, operator):
    """No spot node exists: the spot Deployment asks for maxReplicas (an autoscaler would add nodes). Pods
    unschedulable past the bound shrink the ask to the placed pods + one probe; after the back-off it asks again.

    The pods exist before the RLJob, and the test waits until the operator has seen them (its in-process state),
    so the bound, which counts from the first ask, expires with all four known."""
    api = operator
    sizer = operator_memo().sizer
    for name, node in [("a", "spot-a"), ("b", "spot-a"), ("c", None), ("d", None)]:
        api.create("Pod", spot_pod("auto", f"auto-workers-spot-{name}", node))

    def seen() -> int:  # list() first: the operator's thread adds to the dict meanwhile
        return sum(1 for (ns, _), (job, _) in list(sizer.pods.items()) if (ns, job) == (NS, "auto"))

    wait_until(lambda: seen() == 4, timeout=20, what="the operator seeing the pods")
    spec = {"rollout": {"spot": {"minReplicas": 0, "maxReplicas": 4, "gpusPerWorker": 1, "sizing": "autoscaler"}}}
    api.create("RLJob", rljob("auto", spec))
    wait_until(lambda: spot_replicas(api, "auto") == 4, timeout=20, what="the maximum asked for")
    asking = wait_until(lambda: events(api, "SpotAskingAutoscaler"), timeout=20, what="the asking Event")
    assert asking[0]["message"] == "asking for 4 spot workers for the autoscaler (2 placed)"

    # The shrunk ask lasts 2 s a round: each wait sees one round or a later one, whatever the machine's load. The
    # status is asserted on the one read that showed the back-off: by a second read the next round may have begun.
    wait_until(lambda: spot_replicas(api, "auto") == 3, timeout=60, what="the ask shrunk to 2 placed + 1 probe")
    workers = wait_until(
        lambda: backing_off(status_of(api, "auto")["workers"]), timeout=60, what="the back-off in the status"
    )
    assert workers["spotDesired"] == 3
    assert re.fullmatch(
        r"2 spot pods Pending \(unschedulable\) for \d+s: asking for 3, retrying 4 in 2s", workers["spotMessage"]
    ), workers
    shrink = wait_until(lambda: events(api, "SpotPendingBackoff"), timeout=20, what="the shrink Event")[0]
    assert shrink["type"] == "Warning"
    assert shrink["message"].startswith("spot workers 4 -> 3: 2 spot pods Pending (unschedulable)")
    assert shrink["message"].endswith("asking for 3, retrying 4 in 2s")
    labels = {"rljob_namespace": NS, "rljob": "auto"}
    assert REGISTRY.get_sample_value("rlboost_operator_spot_pending_shrinks_total", labels) >= 1
    assert REGISTRY.get_sample_value("rlboost_operator_spot_unschedulable_pods", labels) == 2

    wait_until(
        lambda: any(
            e["message"].startswith("spot workers 3 -> 4: retrying: asking for 4")
            for e in events(api, "SpotAskingAutoscaler")
        ),
        timeout=20,
        what="the retry",
    )


def _collect(job_nats, user: str, subj: str, received: list[bytes], ready: threading.Event, stop: threading.Event):
    async def main() -> None:
        nc = await nats.connect(job_nats.url, **job_nats.options(user))

        async def on_msg(msg) -> None:
            received.append(msg.data)

        await nc.subscribe(subj, cb=on_msg)
        await nc.flush()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.02)  # polling a thread flag inside the collector, not test synchronisation
        await nc.close()

    asyncio.run(main())


def test_preemption_taint_sends_a_nats_notice_naming_the_jobs_pods(operator, job_nats):
    api = operator
    api.create("RLJob", rljob("preempt"))
    wait_until(lambda: spot_replicas(api, "preempt") is not None, timeout=20, what="children")
    job_nats.start(api, NS, "preempt")
    api.create("Node", spot_node("spot-x"))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "preempt-workers-spot-abc",
            "namespace": NS,
            "resourceVersion": "1",
            "labels": {"rlboost.io/job": "preempt"},
        },
        "spec": {"nodeName": "spot-x"},
    }
    api.create("Pod", pod)
    received: list[bytes] = []
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=_collect, args=(job_nats, "manager", NODES.subject(NS, "preempt"), received, ready, stop)
    )
    thread.start()
    try:
        assert ready.wait(10)
        taint = {"key": "cloud.google.com/impending-node-termination", "value": "", "effect": "NoSchedule"}
        api.patch("Node", None, "spot-x", {"spec": {"taints": [taint]}})
        wait_until(lambda: received, timeout=20, what="a preemption notice on NATS")
    finally:
        stop.set()
        thread.join(10)
    notice = PreemptionNotice.model_validate_json(received[0])
    assert notice.node == "spot-x"
    assert notice.workers == ["preempt-workers-spot-abc"]
    assert notice.reason == "gke-termination"
    assert notice.deadline_s == 30.0
    # The tainted node no longer counts as capacity.
    wait_until(lambda: spot_replicas(api, "preempt") == 1, timeout=20, what="spot workers back to min")


def _publish(job_nats, messages: list[tuple[str, bytes]], user: str = "trainer") -> None:
    async def main() -> None:
        nc = await nats.connect(job_nats.url, **job_nats.options(user))
        for subj, data in messages:
            await nc.publish(subj, data)
        await nc.flush()
        await nc.close()

    asyncio.run(main())


def test_step_reports_and_done_are_written_to_status(operator, job_nats):
    api = operator
    spec = {
        "trainer": {"ranks": 1, "gpusPerRank": 1},
        "rollout": {"reserved": {"replicas": 1, "gpusPerWorker": 1}, "spot": {"minReplicas": 0, "gpusPerWorker": 1}},
        "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.0},
    }
    api.create("RLJob", rljob("reporter", spec))
    wait_until(lambda: status_of(api, "reporter").get("phase") == "Pending", timeout=20, what="phase Pending")
    job_nats.start(api, NS, "reporter")
    api.patch("Deployment", NS, "reporter-workers-reserved", {"status": {"readyReplicas": 1}})
    # The daemon subscribes asynchronously: publish until a report lands.
    report = StepReport(
        step=3,
        reward_mean=0.75,
        tokens=1000,
        rollout_seconds=1.5,
        train_seconds=0.4,
        sync_seconds=0.1,
        weight_version=3,
        weights_checksum="abc",
    )
    steps = STEPS.subject(NS, "reporter")

    def reported() -> bool:
        _publish(job_nats, [(steps, report.model_dump_json().encode())])
        return status_of(api, "reporter").get("step") == 3

    wait_until(reported, timeout=20, interval=0.3, what="status.step == 3")
    st = status_of(api, "reporter")
    assert st["phase"] == "Running"
    assert st["rewardMean"] == 0.75
    assert st["tokensPerSecond"] == 500.0
    assert st["workers"]["reserved"] == 1 and st["workers"]["spot"] == 0
    assert st["costPerHour"] == 20.0  # trainer GPU + reserved worker GPU at $10
    assert st["costEfficiency"] == 500.0 * 3600 / 20.0
    _publish(job_nats, [(DONE.subject(NS, "reporter"), JobDone(ok=True, steps=3).model_dump_json().encode())])
    wait_until(lambda: status_of(api, "reporter").get("phase") == "Succeeded", timeout=20, what="phase Succeeded")


def test_inconsistent_rljob_fails_with_a_condition_and_no_children(operator):
    api = operator
    api.create(
        "RLJob", rljob("toomany", {"trainer": {"ranks": 16}, "algorithm": {"promptsPerStep": 16, "groupSize": 8}})
    )
    api.create("RLJob", rljob("badreward", {"task": {"reward": "no_such_module.rewards:score"}}))
    api.create("RLJob", rljob("minmax", {"rollout": {"spot": {"minReplicas": 5, "maxReplicas": 2}}}))
    for name, field in [("toomany", "trainer.ranks"), ("badreward", "task.reward"), ("minmax", "rollout.spot")]:
        wait_until(lambda n=name: status_of(api, n).get("phase") == "Failed", timeout=20, what=f"{name} Failed")
        cond = status_of(api, name)["conditions"][0]
        assert cond["type"] == "Valid" and cond["status"] == "False" and cond["reason"] == "InvalidSpec"
        assert f"spec.{field}" in cond["message"], cond
        assert api.get("Deployment", NS, f"{name}-manager") is None
        assert api.get("Secret", NS, f"{name}-credentials") is None
    # kopf posts Events from a background task after the handler returned (kopf.warn only queues them), so a job
    # whose status is already Failed may not have its Event yet: wait for them, as for the status (one read here
    # failed once, on the job reconciled last)
    invalid = lambda: [e for e in api.list("Event", NS) if e.get("reason") == "InvalidSpec"]  # noqa: E731
    jobs = {"toomany", "badreward", "minmax"}
    wait_until(lambda: {e["involvedObject"]["name"] for e in invalid()} >= jobs, timeout=20, what="the Events")
    events = invalid()
    assert any("spec.task.reward" in e["message"] for e in events), json.dumps(events)[:500]


def test_status_written_while_the_operator_was_down_reaches_the_rljob(kube_api, job_nats, monkeypatch):
    """Status survives the operator: stop it mid-job, let a step finish and the job end while it is down (the
    trainer publishes as usual), start a new operator: the RLJob gets the newest step and Succeeded (JetStream
    keeps the newest report and `done` per job; the new operator's consumer starts with them)."""
    from kopf.testing import KopfRunner

    monkeypatch.setenv("RLBOOST_OPERATOR_NATS_URL", job_nats.url)
    args = ["run", "-A", "--standalone", "-m", "rlboost_operator.handlers"]
    report = StepReport(
        step=7,
        reward_mean=0.5,
        tokens=10,
        rollout_seconds=1.0,
        train_seconds=0.0,
        sync_seconds=0.0,
        weight_version=7,
        weights_checksum="c",
    )
    with KopfRunner(args, timeout=30) as first:
        wait_until(lambda: kube_api.watched("rljobs"), timeout=20, what="the first operator's watch")
        kube_api.create("RLJob", rljob("durable"))
        wait_until(lambda: status_of(kube_api, "durable").get("phase") == "Pending", timeout=20, what="Pending")
        job_nats.start(kube_api, NS, "durable")
        wait_until(lambda: _stream_exists(job_nats), timeout=20, what="the status stream")
    assert first.exception is None, first.output
    _publish(
        job_nats,
        [
            (STEPS.subject(NS, "durable"), report.model_dump_json().encode()),
            (DONE.subject(NS, "durable"), JobDone(ok=True, steps=8).model_dump_json().encode()),
        ],
    )
    assert status_of(kube_api, "durable").get("phase") == "Pending"  # nobody wrote it meanwhile
    with KopfRunner(args, timeout=30) as second:
        wait_until(lambda: status_of(kube_api, "durable").get("phase") == "Succeeded", timeout=20, what="Succeeded")
        wait_until(lambda: status_of(kube_api, "durable").get("step") == 7, timeout=20, what="the newest step")
    assert second.exception is None, second.output


def _stream_exists(job_nats) -> bool:
    from rlboost_operator.notices import STATUS_STREAM

    async def look() -> bool:
        nc = await nats.connect(job_nats.url, **job_nats.options("operator"))
        try:
            await nc.jetstream().stream_info(STATUS_STREAM)
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    return asyncio.run(look())


def test_busy_sizing_follows_the_step_reports_within_the_nodes_capacity(operator, job_nats):
    """rollout.spot.sizing 'busy': idle spot in the step reports shrinks the spot Deployment, busy spot with a
    waiting trainer grows it again; the target is in the status and a metric."""
    api = operator
    spec = {
        "trainer": {"ranks": 1, "gpusPerRank": 1},
        "rollout": {
            "reserved": {"replicas": 1, "gpusPerWorker": 1},
            "spot": {"sizing": "busy", "minReplicas": 1, "maxReplicas": 4, "gpusPerWorker": 1},
        },
        "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.5},
    }
    api.create("Node", spot_node("spot-a", gpus=4))
    api.create("RLJob", rljob("busy", spec))
    wait_until(lambda: spot_replicas(api, "busy") == 4, timeout=20, what="spot workers at the nodes' capacity")
    job_nats.start(api, NS, "busy")
    steps = STEPS.subject(NS, "busy")

    def report(spot: int, busy: float, wait_s: float) -> bytes:
        return (
            StepReport(
                step=1,
                weight_version=1,
                weights_checksum="x",
                reward_mean=0.0,
                tokens=10,
                rollout_seconds=100.0,
                train_seconds=0.0,
                sync_seconds=0.0,
                trainer_idle_seconds=wait_s,
                pool_workers={"spot": spot},
                spot_busy_fraction=busy,
            )
            .model_dump_json()
            .encode()
        )

    def scaled_to(replicas: int, data: bytes):  # the daemon subscribes asynchronously: publish until it acts
        return lambda: _publish(job_nats, [(steps, data)]) or spot_replicas(api, "busy") == replicas

    wait_until(scaled_to(1, report(4, busy=0.05, wait_s=0.0)), timeout=20, interval=0.3, what="idle spot shrinks")
    wait_until(lambda: status_of(api, "busy")["workers"].get("spotTarget") == 1, timeout=20, what="target in status")
    labels = {"rljob_namespace": NS, "rljob": "busy"}
    assert REGISTRY.get_sample_value("rlboost_operator_spot_target", labels) == 1
    wait_until(scaled_to(2, report(1, busy=0.95, wait_s=50.0)), timeout=20, interval=0.3, what="busy spot grows")
    wait_until(lambda: status_of(api, "busy")["workers"].get("spotTarget") == 2, timeout=20, what="grown target")
    assert status_of(api, "busy")["workers"]["spotReason"] == "SpotBusyScaled"


def test_spot_variants_get_a_deployment_each_and_the_status_prices_each(operator, job_nats):
    """rollout.spot.variants: one Deployment per variant on its own nodes, with its GPU requests and its share of
    the ask (the cheaper per request slot first, bounded by its maxReplicas and its nodes); the status's cost counts
    each variant's ready workers at its own price."""
    api = operator
    accelerator = "cloud.google.com/gke-accelerator"
    variants = [
        {
            "name": "l4",
            "accelerator": "nvidia-l4",
            "pricePerGpuHour": 0.7,
            "maxReplicas": 2,
            "nodeSelector": {accelerator: "nvidia-l4"},
        },
        {
            "name": "a10g",
            "accelerator": "nvidia-a10g",
            "pricePerGpuHour": 1.0,
            "gpusPerWorker": 2,
            "tensorParallel": 2,
            "maxReplicas": 4,
            "nodeSelector": {accelerator: "nvidia-a10g"},
        },
    ]
    spec = {
        "trainer": {"ranks": 1, "gpusPerRank": 1},
        "rollout": {
            "reserved": {"replicas": 1, "gpusPerWorker": 1},
            "spot": {"engine": "sglang", "minReplicas": 0, "maxReplicas": 6, "variants": variants},
        },
        "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 99.0},
    }
    for name, kind, gpus in [
        ("l4-a", "nvidia-l4", 1),
        ("l4-b", "nvidia-l4", 1),
        ("l4-c", "nvidia-l4", 1),
        ("a10g-a", "nvidia-a10g", 4),
    ]:
        node = spot_node(name, gpus=gpus)
        node["metadata"]["labels"][accelerator] = kind
        api.create("Node", node)
    api.create("RLJob", rljob("mixed", spec))

    def replicas(variant: str) -> int | None:
        dep = api.get("Deployment", NS, f"mixed-workers-spot-{variant}")
        return dep["spec"]["replicas"] if dep else None

    wait_until(lambda: (replicas("l4"), replicas("a10g")) == (2, 2), timeout=20, what="2 L4 and 2 A10G workers")
    assert api.get("Deployment", NS, "mixed-workers-spot") is None
    for variant, kind, gpus in [("l4", "nvidia-l4", "1"), ("a10g", "nvidia-a10g", "2")]:
        pod = api.get("Deployment", NS, f"mixed-workers-spot-{variant}")["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {accelerator: kind}
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
    wait_until(lambda: status_of(api, "mixed")["workers"].get("spotSplit") is not None, timeout=20, what="split")
    assert status_of(api, "mixed")["workers"]["spotSplit"] == [
        {"name": "l4", "replicas": 2},
        {"name": "a10g", "replicas": 2},
    ]
    job_nats.start(api, NS, "mixed")
    for name in ("mixed-workers-reserved", "mixed-workers-spot-l4", "mixed-workers-spot-a10g"):
        api.patch("Deployment", NS, name, {"status": {"readyReplicas": 1 if name.endswith("reserved") else 2}})
    report = StepReport(
        step=1,
        reward_mean=0.5,
        tokens=100,
        rollout_seconds=1.0,
        train_seconds=0.0,
        sync_seconds=0.0,
        weight_version=1,
        weights_checksum="x",
    )
    steps = STEPS.subject(NS, "mixed")

    def reported() -> bool:
        _publish(job_nats, [(steps, report.model_dump_json().encode())])
        return status_of(api, "mixed").get("step") == 1

    wait_until(reported, timeout=20, interval=0.3, what="status.step == 1")
    st = status_of(api, "mixed")
    assert st["workers"]["spot"] == 4
    assert st["workers"]["spotVariants"] == [{"name": "l4", "ready": 2}, {"name": "a10g", "ready": 2}]
    assert st["costPerHour"] == pytest.approx(2 * 10.0 + 2 * 1 * 0.7 + 2 * 2 * 1.0)  # trainer + reserved, L4, A10G
