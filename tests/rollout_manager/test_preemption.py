"""Drain on a NATS PreemptionNotice (real nats-server via the fixture, real gRPC manager and worker clients)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from rlboost.wire.events import NODES, PreemptionNotice
from rollout_manager.preemption import NatsUnavailableError, PreemptionSubscriber, handle_notice

from .client import WorkerClient, collect_rollout, rollout_request, status


async def test_preemption_notice_drains_worker_and_migrates_all_tokens(manager, nats_server):
    sub = PreemptionSubscriber(nats_server.url, "ns", "job1", manager.state.drain, manager.kick)
    await sub.start()
    w1 = await WorkerClient(manager.target, "w1", node="node-a", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=5)))
    a1 = (await w1.expect("assign")).assign.assignments[0]
    w1.chunk(a1.request_id, a1.lease_epoch, 0, [7, 8])
    w2 = await WorkerClient(manager.target, "w2", node="node-b", capacity=1).connect()

    nc = await nats.connect(nats_server.url)
    notice = PreemptionNotice(node="node-a", reason="spot-itn", deadline_s=30)
    await nc.publish(NODES.subject("ns", "job1"), NODES.encode(notice))
    await nc.flush()
    drain = await w1.expect("drain")
    assert drain.drain.reason == "spot-itn"
    st = await status(manager.target)
    assert {w.worker_id: w.draining for w in st.workers} == {"w1": True, "w2": False}

    # the worker flushes what it has (one more token) and leaves
    w1.chunk(a1.request_id, a1.lease_epoch, 2, [9], finished=False, reason="abort")  # the worker's contract
    a2 = (await w2.expect("assign")).assign.assignments[0]
    assert list(a2.input_ids)[a2.prompt_len :] == [7, 8, 9]
    await w1.close()
    w2.chunk(a2.request_id, a2.lease_epoch, 3, [10, 11], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [7, 8, 9, 10, 11] and list(traj.workers) == ["w1", "w2"]
    await w2.close()
    await nc.close()
    await sub.stop()


async def test_worker_drain_notice_stops_new_work_and_stream_end_migrates(manager):
    from rlboost.rollout.v1 import rollout_pb2 as pb

    w1 = await WorkerClient(manager.target, "w1", capacity=2).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=3)))
    a1 = (await w1.expect("assign")).assign.assignments[0]
    w1.chunk(a1.request_id, a1.lease_epoch, 0, [1])
    w1.send(pb.WorkerMessage(drain=pb.DrainNotice(reason="SIGTERM", deadline_ms=1000)))
    await w1.close()  # stream ends without finishing: the request migrates with its token
    w2 = await WorkerClient(manager.target, "w2", capacity=2).connect()
    a2 = (await w2.expect("assign")).assign.assignments[0]
    assert list(a2.input_ids)[3:] == [1]
    w2.chunk(a2.request_id, a2.lease_epoch, 1, [2, 3], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [1, 2, 3]
    await w2.close()


def test_bad_notice_is_ignored_and_worker_list_matches():
    calls = []

    def drain(node, workers, reason):
        calls.append((node, workers, reason))
        return workers

    assert handle_notice(b"{not json", drain) == [] and calls == []
    assert handle_notice(b'{"workers": ["w9"], "reason": "rebalance"}', drain) == ["w9"]
    assert calls == [("", ["w9"], "rebalance")]


async def test_unreachable_nats_is_one_clear_error():
    from rlboost.nats_server import free_port

    sub = PreemptionSubscriber(f"nats://127.0.0.1:{free_port()}", "ns", "j", lambda *a: [])
    with pytest.raises(NatsUnavailableError, match="cannot reach NATS"):
        await sub.start(connect_timeout=1)
