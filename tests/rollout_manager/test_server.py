"""End to end over real gRPC (loopback): assignment, chunk collection, trajectory stream, migration,
lease expiry with zombie fencing, balancing, cancellation and malformed messages.

The workers are in-test clients speaking the generated stubs; the manager is the real server.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest
from prometheus_client import REGISTRY

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rlboost.wire.rollout_io import request_id, sample_seed
from rlboost.wire.rollout_proto import status_from_pb
from rollout_manager.server import RolloutManagerServer

from .client import SAFETY_LEASE_MS, ManualClock, WorkerClient, collect_rollout, rollout_request, status


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def wait_for(predicate, timeout: float = 5.0, what: str = "condition"):
    """Async poll with a deadline (the asyncio twin of tests.helpers.wait_until)."""

    async def _poll():
        while not (value := await predicate()):
            await asyncio.sleep(0.02)
        return value

    try:
        return await asyncio.wait_for(_poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


async def test_assign_collect_and_stream_trajectories(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=8).connect()
    assert w1.registered.lease_timeout_ms == SAFETY_LEASE_MS and w1.registered.chunk_max_tokens == 16
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(step=3, prompts=2, group=2)))
    batch = (await w1.expect("assign")).assign.assignments
    assert sorted(a.request_id for a in batch) == sorted(request_id(3, p, g) for p in range(2) for g in range(2))
    for a in batch:
        p, g = int(a.request_id.split("-p")[1].split("-")[0]), int(a.request_id.rsplit("-g", 1)[1])
        assert a.sampling.seed == sample_seed(7, 3, p, g) and a.lease_epoch == 1 and a.prompt_len == 3
        w1.chunk(a.request_id, 1, 0, [1, 2])
        w1.chunk(a.request_id, 1, 2, [3], finished=True, reason="stop")
    trajs = await asyncio.wait_for(rollout, 5)
    assert len(trajs) == 4 and all(list(t.response_ids) == [1, 2, 3] for t in trajs)
    assert all(list(t.workers) == ["w1"] and t.finish_reason == "stop" and t.step == 3 for t in trajs)
    st = await status(manager.target)
    assert (st.finished, st.pending, st.running, st.tokens_received) == (4, 0, 0, 12)
    assert st.workers[0].tokens_generated == 12 and st.workers[0].pool == pb.POOL_SPOT
    await w1.close()


async def test_stream_dropped_mid_response_continues_from_exact_offset(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=6)))
    a1 = (await w1.expect("assign")).assign.assignments[0]
    w1.chunk(a1.request_id, a1.lease_epoch, 0, [10, 11, 12])
    await wait_for(lambda: _tokens_received(manager.target, 3), what="3 tokens received")
    await w1.drop()
    w2 = await WorkerClient(manager.target, "w2", capacity=1).connect()
    a2 = (await w2.expect("assign")).assign.assignments[0]
    assert list(a2.input_ids) == [100, 200, 300, 10, 11, 12] and a2.prompt_len == 3
    assert a2.lease_epoch == a1.lease_epoch + 1 and a2.sampling.max_new_tokens == 6
    w2.chunk(a2.request_id, a2.lease_epoch, 3, [13, 14, 15], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [10, 11, 12, 13, 14, 15] and list(traj.workers) == ["w1", "w2"]
    assert len(traj.logprobs) == 6
    st = status_from_pb(await status(manager.target))
    assert st.migrations == 1 and st.migrations_by_reason == {"stream_broken": 1}
    assert (st.tokens_received, st.tokens_lost, st.tokens_regenerated) == (6, 0, 0)
    await w2.close()


async def _tokens_received(target: str, n: int) -> bool:
    return (await status(target)).tokens_received >= n


async def test_lease_expiry_fences_zombie_chunks():
    """The manager's clock is the test's: w1's lease expires when the test moves it past 300 ms (a loaded machine
    cannot expire w2 as well, nor keep w1 alive), then its request continues on w2 and w1's late chunk is fenced."""
    clock = ManualClock()
    manager = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=50, lease_timeout_ms=300), balance_interval_s=3600.0, clock=clock
    )
    manager.target = f"127.0.0.1:{await manager.start('127.0.0.1', 0)}"
    try:
        await _zombie_is_fenced(manager, clock)
    finally:
        await manager.stop(grace=0)


async def _zombie_is_fenced(manager: RolloutManagerServer, clock: ManualClock) -> None:
    zombie = await WorkerClient(manager.target, "w1", capacity=1, heartbeats=False).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=4)))
    a1 = (await zombie.expect("assign")).assign.assignments[0]
    zombie.chunk(a1.request_id, a1.lease_epoch, 0, [1, 2])
    await wait_for(lambda: _tokens_received(manager.target, 2), what="w1's chunk received")
    expiries = metric("rlboost_manager_lease_expiries_total")
    clock.t += 0.301  # w1 has been silent for longer than its lease
    revoke = await zombie.expect("revoke")
    assert list(revoke.revoke.request_ids) == [a1.request_id] and revoke.revoke.reason == "lease_expired"
    assert metric("rlboost_manager_lease_expiries_total") == expiries + 1
    w2 = await WorkerClient(manager.target, "w2", capacity=1).connect()
    a2 = (await w2.expect("assign")).assign.assignments[0]
    assert list(a2.input_ids)[3:] == [1, 2] and a2.lease_epoch == 2
    stale = metric("rlboost_manager_stale_chunks_total")
    zombie.chunk(a1.request_id, a1.lease_epoch, 2, [99, 98], finished=True, reason="stop")  # late, old epoch
    await wait_for(lambda: _is(metric("rlboost_manager_stale_chunks_total") == stale + 1), what="stale chunk counted")
    w2.chunk(a2.request_id, a2.lease_epoch, 2, [3, 4], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [1, 2, 3, 4] and list(traj.workers) == ["w1", "w2"]
    await w2.close()
    await zombie.drop()


async def _is(value: bool) -> bool:
    return value


async def test_offset_gap_is_rejected_and_request_resyncs(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=4)))
    a1 = (await w1.expect("assign")).assign.assignments[0]
    w1.chunk(a1.request_id, 1, 0, [5])
    w1.chunk(a1.request_id, 1, 3, [8])  # tokens 1..2 never arrived
    revoke = await w1.expect("revoke")
    assert revoke.revoke.reason == "offset_gap"
    w1.chunk(a1.request_id, 1, 1, [6], finished=True, reason="abort")  # the worker's flush on revoke
    a2 = (await w1.expect("assign")).assign.assignments[0]
    assert list(a2.input_ids)[3:] == [5, 6] and a2.lease_epoch == 2
    w1.chunk(a2.request_id, 2, 2, [7, 8], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [5, 6, 7, 8]
    await w1.close()


async def test_new_worker_gets_work_at_once_by_rebalancing(manager):
    manager.balance_interval_s = 0.05
    w1 = await WorkerClient(manager.target, "w1", capacity=4).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(group=4, max_new_tokens=2)))
    first = (await w1.expect("assign")).assign.assignments
    assert len(first) == 4
    w2 = await WorkerClient(manager.target, "w2", capacity=4).connect()
    revoke = (await w1.expect("revoke")).revoke
    assert revoke.reason == "rebalance" and len(revoke.request_ids) == 2
    epochs = {a.request_id: a.lease_epoch for a in first}
    for rid in revoke.request_ids:
        w1.chunk(rid, epochs[rid], 0, [], finished=True, reason="abort")
    moved = list((await w2.expect("assign")).assign.assignments)
    if len(moved) < 2:  # the two flushes may be scheduled in separate passes
        moved += (await w2.expect("assign")).assign.assignments
    assert sorted(a.request_id for a in moved) == sorted(revoke.request_ids)
    for a in moved:
        w2.chunk(a.request_id, a.lease_epoch, 0, [1, 2], finished=True, reason="length")
    for rid in set(epochs) - set(revoke.request_ids):
        w1.chunk(rid, epochs[rid], 0, [1, 2], finished=True, reason="length")
    trajs = await asyncio.wait_for(rollout, 5)
    assert sorted(tuple(t.workers) for t in trajs) == [("w1",), ("w1",), ("w2",), ("w2",)]
    await w1.close()
    await w2.close()


async def test_weight_version_pushed_then_work_assigned(manager):
    w1 = await WorkerClient(manager.target, "w1", version=0).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(version=1, max_new_tokens=1)))
    assert (await w1.expect("set_weight_version")).set_weight_version.weight_version == 1
    w1.version = 1
    w1.send(pb.WorkerMessage(weight_version=pb.WeightVersionReport(weight_version=1, checksum="x")))
    a = (await w1.expect("assign")).assign.assignments[0]
    assert a.weight_version == 1
    w1.chunk(a.request_id, a.lease_epoch, 0, [4], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert traj.weight_version == 1
    await w1.close()


async def test_trainer_cancel_revokes_the_steps_requests(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=2).connect()
    channel = grpc.aio.insecure_channel(manager.target)
    from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

    call = pb_grpc.RolloutManagerStub(channel).Rollout(rollout_request(group=3))
    assigned = (await w1.expect("assign")).assign.assignments
    assert len(assigned) == 2
    call.cancel()
    revoke = (await w1.expect("revoke")).revoke
    assert revoke.reason == "cancelled" and sorted(revoke.request_ids) == sorted(a.request_id for a in assigned)
    st = await status(manager.target)
    assert (st.pending, st.running) == (0, 0)
    await channel.close()
    await w1.close()


async def test_malformed_chunk_ends_stream_with_invalid_argument_and_migrates(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=2)))
    a1 = (await w1.expect("assign")).assign.assignments[0]
    bad = pb.TokenChunk(request_id=a1.request_id, lease_epoch=1, offset=0, token_ids=[1, 2], logprobs=[0.0])
    w1.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[bad])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await w1.expect("assign")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk.logprobs" in err.value.details()
    w2 = await WorkerClient(manager.target, "w2", capacity=1).connect()
    a2 = (await w2.expect("assign")).assign.assignments[0]
    assert a2.request_id == a1.request_id and a2.lease_epoch == 2
    w2.chunk(a2.request_id, 2, 0, [1, 2], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.workers) == ["w2"]
    await w2.close()
    w1.stop_heartbeats()


async def test_first_message_must_be_register(manager):
    bad = WorkerClient(manager.target, "w1")
    await bad.connect(first=pb.WorkerMessage(heartbeat=pb.Heartbeat(weight_version=0)))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(bad.call.read(), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "register" in err.value.details()
    await bad.channel.close()


async def test_bad_registration_and_bad_rollout_are_invalid_argument(manager):
    bad = WorkerClient(manager.target, "w1", capacity=0)
    await bad.connect(first=pb.WorkerMessage(register=bad.register))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(bad.call.read(), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "register.capacity" in err.value.details()
    await bad.channel.close()
    request = rollout_request()
    request.group_size = 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect_rollout(manager.target, request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "group_size" in err.value.details()


async def test_offload_window_moves_reserved_work_to_spot():
    from rlboost.policies.offload import OffloadConfig, OffloadWindow

    window = OffloadWindow(OffloadConfig(initial_s=0.2, min_s=0.1))
    manager = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=50, lease_timeout_ms=SAFETY_LEASE_MS), 3600.0, window
    )
    target = f"127.0.0.1:{await manager.start('127.0.0.1', 0)}"
    r1 = await WorkerClient(target, "r1", pool=pb.POOL_RESERVED, capacity=1).connect()
    s1 = await WorkerClient(target, "s1", pool=pb.POOL_SPOT, capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(target, rollout_request(group=2, max_new_tokens=4)))
    ar = (await r1.expect("assign")).assign.assignments[0]
    a_s = (await s1.expect("assign")).assign.assignments[0]
    r1.chunk(ar.request_id, ar.lease_epoch, 0, [1, 2])
    revoke = (await r1.expect("revoke")).revoke  # after T = 0.2 s
    assert revoke.reason == "offload" and list(revoke.request_ids) == [ar.request_id]
    r1.chunk(ar.request_id, ar.lease_epoch, 2, [], finished=True, reason="abort")
    s1.chunk(a_s.request_id, a_s.lease_epoch, 0, [5, 5, 5, 5], finished=True, reason="length")
    cont = (await s1.expect("assign")).assign.assignments[0]
    assert cont.request_id == ar.request_id and list(cont.input_ids)[3:] == [1, 2]
    s1.chunk(cont.request_id, cont.lease_epoch, 2, [3, 4], finished=True, reason="length")
    trajs = {t.request_id: t for t in await asyncio.wait_for(rollout, 5)}
    assert list(trajs[ar.request_id].workers) == ["r1", "s1"]
    assert list(trajs[ar.request_id].response_ids) == [1, 2, 3, 4]
    assert window.window_s != 0.2  # adapted from the measured bubble
    await r1.close()
    await s1.close()
    await manager.stop(grace=0)
