"""The operator's collaborators without a cluster: what the startup handler puts in kopf's memo, and each object's
own state (running jobs, nodes, the spot sizer's pods, the preemption notices, the status stream)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import kopf
import pytest

from rlboost.spec import JobSpec, parse_job_spec
from rlboost.wire.events import PreemptionNotice
from rlboost_operator import spot_ask
from rlboost_operator.config import OperatorSettings
from rlboost_operator.preemption import PreemptionNotices
from rlboost_operator.shared import JobRef, Jobs, Nodes
from rlboost_operator.sizing import SpotSizer
from rlboost_operator.startup import fill_memo
from rlboost_operator.status_stream import StatusStream

GOING = [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]


def node(name: str, taints: list[dict[str, str]] | None = None, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"cloud.google.com/gke-spot": "true"}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_the_memo_holds_one_collaborator_per_concern_sharing_the_jobs_nodes_and_links() -> None:
    memo = kopf.Memo()
    fill_memo(memo, OperatorSettings())
    assert {"settings", "api", "jobs", "nodes", "links", "sizer", "notices", "stream", "identity", "trainers"} <= set(
        memo
    )
    assert memo.sizer.jobs is memo.jobs is memo.stream.jobs is memo.notices.jobs is memo.identity.jobs
    assert memo.sizer.nodes is memo.nodes is memo.notices.nodes
    assert memo.stream.links is memo.links is memo.notices.links and memo.stream.sizer is memo.sizer
    with pytest.raises(kopf.TemporaryError, match="not logged in"):
        memo.api.client()  # a handler before kopf's login is retried


def test_every_watched_resource_has_one_handler_and_the_handler_ids_are_kept() -> None:
    """Two handlers of one resource would run in the order their modules were imported; one each keeps the order
    of what an event does in watches.py. The ids are kopf's keys of a handler's progress on an RLJob."""
    import rlboost_operator.handlers  # noqa: F401

    registry = kopf.get_default_registry()
    watching = [h.id for h in registry._watching.get_all_handlers()]
    kueue = ["workload_event"] if "rlboost_operator.kueue_watch" in sys.modules else []  # imported with its setting
    assert sorted(watching) == ["node_event", "pod_event", "rljob_event", *kueue]
    changing = {h.id for h in registry._changing.get_all_handlers()}
    assert changing == {"rljob_reconcile", "rljob_reconcile/spec", "rljob_reconcile/metadata.labels"}


def test_jobs_keep_the_newest_ref_and_one_status_lock_per_job() -> None:
    jobs = Jobs()
    first, second = JobRef("ns", "j", "u1", JobSpec()), JobRef("ns", "j", "u2", JobSpec())
    assert jobs.put(first) is None and jobs.put(second) is first
    assert ("ns", "j") in jobs and jobs.get("ns", "j") is second and jobs.running() == [second]
    assert jobs.status_lock("ns", "j") is jobs.status_lock("ns", "j") is not jobs.status_lock("ns", "k")
    assert jobs.pop("ns", "j") is second and not jobs and jobs.get("ns", "j") is None


def test_nodes_observed_twice_stay_one_and_those_going_away_are_doomed() -> None:
    nodes = Nodes()
    for _ in range(2):  # idempotent
        nodes.observe("a", node("a"), deleted=False)
        nodes.observe("b", node("b", GOING), deleted=False)
    assert len(list(nodes.values())) == 2 and nodes.doomed() == {"b"}
    nodes.observe("b", node("b", GOING), deleted=True)
    assert "b" not in nodes and nodes.get("b") == {} and nodes.doomed() == set()


def sizer(settings: OperatorSettings | None = None) -> SpotSizer:
    memo = kopf.Memo()
    fill_memo(memo, settings or OperatorSettings())
    return memo.sizer


def spot_pod(name: str, node_name: str | None) -> dict[str, Any]:
    labels = {"rlboost.io/job": "j", "rlboost.io/pool": "spot"}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": node_name}, "status": {}}


def test_the_sizer_tracks_a_jobs_spot_pods_and_says_when_one_changed() -> None:
    s = sizer()
    assert s.track_pod(False, spot_pod("p1", "n1"), "ns", "p1", "j")
    assert not s.track_pod(False, spot_pod("p1", "n1"), "ns", "p1", "j")  # the same: no rescale
    assert s.track_pod(False, spot_pod("p1", "n2"), "ns", "p1", "j")
    reserved = {**spot_pod("r1", "n1"), "metadata": {"labels": {"rlboost.io/pool": "reserved"}}}
    assert not s.track_pod(False, reserved, "ns", "r1", "j")
    assert s.pods_of("ns", "j") == [spot_ask.SpotPod("n2")] and s.pods_of("other", "j") == []
    assert s.track_pod(True, spot_pod("p1", "n2"), "ns", "p1", "j") and s.pods_of("ns", "j") == []


def test_the_sizer_decides_on_the_nodes_present_and_forgets_a_dropped_job() -> None:
    s = sizer()
    spec = parse_job_spec({"rollout": {"spot": {"minReplicas": 0, "maxReplicas": 5, "gpusPerWorker": 1}}})
    for name in ("a", "b", "c"):
        s.nodes.observe(name, node(name, GOING if name == "c" else None), deleted=False)
    decision = s.decide("ns", "j", spec)
    assert (decision.replicas, decision.reason) == (2, spot_ask.CAPACITY)  # c is going away
    s.jobs.put(JobRef("ns", "j", "u", spec, decision.replicas, decision.reason))
    s.drop("ns", "j")
    assert s.jobs.get("ns", "j") is None and ("ns", "j") not in s.asks and not s.rechecks


class FakeLink:
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.sent = fail, []

    async def publish_notice(self, namespace: str, job: str, notice: PreemptionNotice) -> bool:
        if self.fail:
            raise ConnectionError("NATS is down")
        self.sent.append((namespace, job, notice))
        return True


class FakeLinks:
    def __init__(self, links: dict[tuple[str, str], FakeLink]) -> None:
        self.links = links

    def get(self, namespace: str, job: str) -> FakeLink | None:
        return self.links.get((namespace, job))


async def test_a_node_going_away_is_announced_once_to_each_job_with_pods_on_it() -> None:
    links = {("ns", "j"): FakeLink(), ("ns", "k"): FakeLink()}
    nodes = Nodes()
    notices = PreemptionNotices(Jobs(), nodes, FakeLinks(links))
    for pod, job in (("j-w1", "j"), ("j-w2", "j"), ("k-w1", "k")):
        await notices.pod_changed("ns", pod, job, "n1")
    await notices.pod_changed("ns", "j-w3", "j", "n2")
    nodes.observe("n1", node("n1", GOING), deleted=False)
    for _ in range(2):
        await notices.node_changed("n1", node("n1", GOING), deleted=False)
    [(_, _, to_j)] = links[("ns", "j")].sent
    assert to_j.node == "n1" and to_j.workers == ["j-w1", "j-w2"] and to_j.reason == "gke-termination"
    assert [n.workers for _, _, n in links[("ns", "k")].sent] == [["k-w1"]]
    await notices.pod_changed("ns", "k-w2", "k", "n1")  # a pod landing on the doomed node: announced at once
    assert [n.workers for _, _, n in links[("ns", "k")].sent] == [["k-w1"], ["k-w1", "k-w2"]]
    await notices.node_changed("n1", node("n1"), deleted=False)  # recovered: may be announced again
    assert ("n1", "gke-termination") not in notices.notified


async def test_a_notice_that_could_not_be_sent_is_tried_again_on_the_next_event() -> None:
    link = FakeLink(fail=True)
    notices = PreemptionNotices(Jobs(), Nodes(), FakeLinks({("ns", "j"): link}))
    await notices.pod_changed("ns", "j-w1", "j", "n1")
    await notices.node_changed("n1", node("n1", GOING), deleted=False)
    assert notices.notified == set()
    link.fail = False
    await notices.node_changed("n1", node("n1", GOING), deleted=False)
    assert len(link.sent) == 1


async def test_the_status_stream_waits_for_the_jobs_link_and_stops_a_follower() -> None:
    memo = kopf.Memo()
    fill_memo(memo, OperatorSettings())
    stream: StatusStream = memo.stream
    with pytest.raises(kopf.TemporaryError, match="no link to the job's NATS yet"):
        await stream.subscribe("ns", "j", JobSpec(), None)
    stream.follow_soon("ns", "j", JobSpec(), None)
    task = stream.followers[("ns", "j")]
    stream.follow_soon("ns", "j", JobSpec(), None)  # one follower per job
    assert stream.followers[("ns", "j")] is task
    await stream.stop("ns", "j")
    assert ("ns", "j") not in stream.followers
    with pytest.raises(asyncio.CancelledError):
        await task
