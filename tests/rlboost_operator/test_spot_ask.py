"""The spot ask over time (rlboost_operator/spot_ask.py): pure, the clock passed in as seconds."""

from __future__ import annotations

from rlboost.spec import PoolSpec
from rlboost_operator import spot_ask
from rlboost_operator.spot_ask import AskSettings, SpotAsk, SpotPod

POOL = PoolSpec(min_replicas=1, max_replicas=8, gpus_per_worker=1)
SETTINGS = AskSettings(pending_timeout_s=300, retry_backoff_s=600, retry_backoff_max_s=1800, probe_workers=1)


def pods(placed: int, unschedulable_since: float | None = None, waiting: int = 0, node: str = "n") -> list[SpotPod]:
    """`placed` pods on nodes n-0.., `waiting` pods the scheduler found no node for since `unschedulable_since`."""
    return [SpotPod(f"{node}-{i}") for i in range(placed)] + [SpotPod(None, unschedulable_since)] * waiting


def test_asks_for_the_maximum_with_zero_nodes_so_the_autoscaler_provisions_them():
    ask = SpotAsk(SETTINGS)
    decision = ask.decide(0.0, POOL, [], set())
    assert (decision.replicas, decision.reason) == (8, spot_ask.ASKING)
    assert decision.message == "asking for 8 spot workers for the autoscaler (0 placed)"
    assert decision.recheck_s is None  # nothing waits: nothing to look at later
    # Pods waiting for nodes, within the bound: keep asking, and look again when the first one crosses it.
    waiting = ask.decide(200.0, POOL, pods(0, unschedulable_since=1.0, waiting=8), set())
    assert (waiting.replicas, waiting.recheck_s) == (8, 101.0)


def test_pending_past_the_bound_shrinks_to_the_placed_pods_plus_a_probe_then_retries_with_growing_backoff():
    ask = SpotAsk(SETTINGS)
    ask.decide(0.0, POOL, [], set())
    shrink = ask.decide(400.0, POOL, pods(4, unschedulable_since=50.0, waiting=4), set())
    assert (shrink.replicas, shrink.reason, shrink.shrunk) == (5, spot_ask.BACKING_OFF, True)
    assert shrink.message == "4 spot pods Pending (unschedulable) for 5m50s: asking for 5, retrying 8 in 10m"
    assert shrink.recheck_s == 600.0
    # Backing off: the ask follows the placed pods (a probe that found a node asks for one more).
    held = ask.decide(500.0, POOL, pods(4, unschedulable_since=50.0, waiting=1), set())
    assert (held.replicas, held.reason, held.shrunk) == (5, spot_ask.BACKING_OFF, False)
    assert held.message == "4 spot workers placed: asking for 5, retrying 8 in 8m20s"
    assert held.recheck_s == 500.0
    assert ask.decide(600.0, POOL, pods(5, unschedulable_since=50.0, waiting=1), set()).replicas == 6
    # After the back-off: the maximum again; pending time counts from the retry, not from the pod's start.
    retry = ask.decide(1000.0, POOL, pods(5, unschedulable_since=50.0, waiting=1), set())
    assert (retry.replicas, retry.reason) == (8, spot_ask.ASKING)
    assert retry.message == "retrying: asking for 8 spot workers for the autoscaler (5 placed)"
    assert retry.recheck_s == 300.0  # the pod still waiting gets the full bound again
    assert ask.decide(1299.0, POOL, pods(5, unschedulable_since=50.0, waiting=3), set()).replicas == 8
    # Still short: shrink again, and the back-off has doubled.
    again = ask.decide(1300.0, POOL, pods(5, unschedulable_since=50.0, waiting=3), set())
    assert (again.replicas, again.shrunk) == (6, True)
    assert again.message.endswith("retrying 8 in 20m")
    assert ask.decide(2499.0, POOL, pods(5), set()).reason == spot_ask.BACKING_OFF
    # Capped at retry_backoff_max_s.
    assert ask.decide(2500.0, POOL, pods(5), set()).replicas == 8
    assert ask.decide(2800.0, POOL, pods(5, 2500.0, waiting=3), set()).message.endswith("retrying 8 in 30m")


def test_a_fully_placed_ask_resets_the_backoff():
    ask = SpotAsk(SETTINGS)
    ask.decide(0.0, POOL, [], set())
    assert ask.decide(300.0, POOL, pods(2, 0.0, waiting=6), set()).message.endswith("in 10m")
    ask.decide(900.0, POOL, pods(2), set())  # retry
    assert ask.decide(950.0, POOL, pods(8), set()).replicas == 8  # every pod found a node
    ask.decide(1000.0, POOL, pods(6), set())
    assert ask.decide(1300.0, POOL, pods(6, 1000.0, waiting=2), set()).message.endswith("in 10m")


def test_no_shrink_when_the_probe_is_all_that_waits():
    ask = SpotAsk(SETTINGS)
    first = ask.decide(1000.0, POOL, pods(7, unschedulable_since=0.0, waiting=1), set())
    later = ask.decide(1300.0, POOL, pods(7, unschedulable_since=0.0, waiting=1), set())
    assert (first.replicas, first.reason, first.recheck_s) == (8, spot_ask.ASKING, 300.0)
    assert (later.replicas, later.reason, later.recheck_s) == (8, spot_ask.ASKING, None)


def test_pods_on_tainted_or_cordoned_nodes_shrink_the_ask_at_once_in_every_state():
    ask = SpotAsk(SETTINGS)
    running = pods(3, node="gone") + pods(3)
    decision = ask.decide(0.0, POOL, running, {"gone-0", "gone-1"})
    assert decision.replicas == 6
    assert decision.message == "asking for 6 spot workers for the autoscaler (4 placed, 2 on nodes going away)"
    shrink = ask.decide(400.0, POOL, [*running, SpotPod(None, 0.0)], {"gone-0", "gone-1"})
    assert shrink.replicas == 5  # 4 placed on healthy nodes + the probe
    # The clamp to [minReplicas, maxReplicas] holds.
    tiny = PoolSpec(min_replicas=2, max_replicas=3)
    assert SpotAsk(SETTINGS).decide(0.0, tiny, pods(3, node="gone"), {"gone-0", "gone-1", "gone-2"}).replicas == 2


def test_capacity_sizing_is_unchanged():
    node = {
        "metadata": {"name": "a", "labels": {"cloud.google.com/gke-spot": "true"}},
        "status": {"allocatable": {"nvidia.com/gpu": "3"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert spot_ask.capacity_decision([], POOL) == spot_ask.Decision(
        1, spot_ask.CAPACITY, "1 spot workers: capacity on spot nodes"
    )
    assert spot_ask.capacity_decision([node], POOL).replicas == 3
    tainted = {**node, "spec": {"taints": [{"key": "cloud.google.com/impending-node-termination"}]}}
    assert spot_ask.capacity_decision([tainted], POOL).replicas == 1


def test_pods_as_the_policy_sees_them():
    unschedulable = {
        "metadata": {"labels": {"rlboost.io/pool": "spot"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastTransitionTime": "1970-01-01T00:01:40Z",
                }
            ],
        },
    }
    assert spot_ask.spot_pod(unschedulable, first_seen_unschedulable=500.0) == SpotPod(None, 100.0)
    no_time = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    assert spot_ask.spot_pod(no_time, first_seen_unschedulable=500.0) == SpotPod(None, 500.0)
    assert spot_ask.spot_pod({"spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}, 0.0) == SpotPod("n1")
    assert spot_ask.spot_pod({"status": {"phase": "Pending"}}, 0.0) == SpotPod(None)  # not yet seen by the scheduler
    assert spot_ask.counts_as_spot_worker(unschedulable)
    assert not spot_ask.counts_as_spot_worker({"metadata": {"labels": {"rlboost.io/pool": "reserved"}}})
    assert not spot_ask.counts_as_spot_worker({**unschedulable, "status": {"phase": "Failed"}})
    deleting = {"metadata": {"labels": {"rlboost.io/pool": "spot"}, "deletionTimestamp": "2024-01-01T00:00:00Z"}}
    assert not spot_ask.counts_as_spot_worker(deleting)


def restarted(ask: SpotAsk) -> SpotAsk:
    """The state machine as a new operator (restarted, or a new leader) takes it up from the RLJob's status."""
    return SpotAsk.from_status(SETTINGS, ask.to_status())


def test_a_new_operator_carries_on_with_the_back_off_the_status_kept():
    """Epoch times as RLJob status keeps them: a restart mid-back-off keeps backing off until the same retry time
    and doubles the next back-off, instead of asking for the maximum (and waiting out the bound) from scratch."""
    t0 = 1_800_000_000.0
    ask = SpotAsk(SETTINGS)
    ask.decide(t0, POOL, [], set())
    ask.decide(t0 + 400, POOL, pods(4, unschedulable_since=t0 + 50, waiting=4), set())  # shrunk, retry at t0+1000
    saved = ask.to_status()
    assert saved == {"askedAt": None, "retryAt": "2027-01-15T08:16:40.000000Z", "backoffSeconds": 1200.0}
    new = restarted(ask)
    held = new.decide(t0 + 500, POOL, pods(4, unschedulable_since=t0 + 50, waiting=1), set())
    assert (held.replicas, held.reason, held.recheck_s) == (5, spot_ask.BACKING_OFF, 500.0)
    asking = restarted(new)
    retry = asking.decide(t0 + 1000, POOL, pods(4), set())
    assert (retry.replicas, retry.reason) == (8, spot_ask.ASKING)
    assert retry.message.startswith("retrying: ")
    again = restarted(asking).decide(t0 + 1400, POOL, pods(4, unschedulable_since=t0 + 1001, waiting=4), set())
    assert again.shrunk and again.recheck_s == 1200.0  # the doubled back-off survived the restarts


def test_an_ask_for_the_maximum_keeps_its_pending_bound_across_a_restart():
    t0 = 1_800_000_000.0
    ask = SpotAsk(SETTINGS)
    ask.decide(t0, POOL, [], set())
    shrink = restarted(ask).decide(t0 + 301, POOL, pods(0, unschedulable_since=t0 - 100, waiting=8), set())
    assert shrink.shrunk  # the bound counted from the first ask, not from the restart


def test_a_missing_or_unreadable_saved_state_is_a_fresh_start():
    for saved in (None, {}, {"askedAt": "yesterday", "retryAt": None, "backoffSeconds": "x"}):
        ask = SpotAsk.from_status(SETTINGS, saved)
        assert (ask.asked_at, ask.retry_at, ask.backoff_s) == (None, None, None)
