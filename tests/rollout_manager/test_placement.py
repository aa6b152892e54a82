"""Speed-aware placement over real gRPC: the manager measures each worker's decode rate and weight-sync time from
what its stream says, shows them in GetStatus, and gives the long request to the fast worker.

The manager runs on a test clock the test advances (a worker's speed is tokens over the manager's time), with
leases long enough that the jumps never expire one; the workers are the in-test stream clients."""

from __future__ import annotations

import asyncio

import pytest

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rollout_manager.server import RolloutManagerServer

from .client import ManualClock, WorkerClient, collect_rollout, rollout_request, status


@pytest.fixture
async def timed_manager():
    clock = ManualClock()
    server = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=1000, lease_timeout_ms=600_000), balance_interval_s=3600.0, clock=clock
    )
    server.clock_at = clock
    server.target = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
    yield server
    await server.stop(grace=0)


async def _until(target: str, predicate, what: str, timeout: float = 5.0):
    """The manager's status once `predicate(status)` holds (polled with a deadline)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        reply = await status(target)
        if predicate(reply):
            return reply
        await asyncio.sleep(0.02)  # polling interval of a condition with a deadline
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _worker(reply: pb.StatusReply, wid: str) -> pb.WorkerStatus:
    return next(w for w in reply.workers if w.worker_id == wid)


def _abort(a: pb.Assignment, tokens: int) -> pb.TokenChunk:
    return pb.TokenChunk(
        request_id=a.request_id,
        lease_epoch=a.lease_epoch,
        offset=0,
        token_ids=[7] * tokens,
        logprobs=[-0.5] * tokens,
        finish_reason="abort",
    )


def _heartbeat(w: WorkerClient, released: bool) -> None:
    w.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(weight_version=w.version, memory_released=released)))


async def _measure_speeds(server, slow: WorkerClient, fast: WorkerClient) -> None:
    """Step 0: one request each; the fast worker streams 16 tokens in 0.1 s, the slow one 16 in 2 s."""
    step = asyncio.create_task(collect_rollout(server.target, rollout_request(step=0, prompts=2, max_new_tokens=64)))
    on_slow = (await slow.expect("assign")).assign.assignments[0]
    on_fast = (await fast.expect("assign")).assign.assignments[0]
    server.clock_at.t += 0.1
    fast.chunk(on_fast.request_id, on_fast.lease_epoch, 0, [5] * 16, finished=True, reason="stop")
    await _until(server.target, lambda r: _worker(r, "b-fast").tokens_per_s > 0, "the fast worker's rate")
    server.clock_at.t += 1.9
    slow.chunk(on_slow.request_id, on_slow.lease_epoch, 0, [5] * 16, finished=True, reason="stop")
    assert len(await step) == 2


@pytest.mark.parametrize("speed_aware", [True, False], ids=["speed-aware", "least-loaded"])
async def test_the_long_request_lands_on_the_fast_worker(timed_manager, speed_aware):
    """Two requests come back pending at once (the slow worker gave them back), one 100 tokens in, one 5 tokens in
    where its group's finished response had 10: with both workers idle, least-loaded placement gives the first in
    line (the long one) to the worker whose id sorts first, the slow one; speed-aware gives it to the fast one."""
    server = timed_manager
    server.state.speed.aware = speed_aware
    slow = await WorkerClient(server.target, "a-slow", capacity=3, heartbeats=False).connect()
    fast = await WorkerClient(server.target, "b-fast", capacity=3, heartbeats=False).connect()
    await _measure_speeds(server, slow, fast)
    reply = await status(server.target)
    assert _worker(reply, "b-fast").tokens_per_s == pytest.approx(160.0)
    assert _worker(reply, "a-slow").tokens_per_s == pytest.approx(8.0)

    _heartbeat(fast, released=True)  # the fast one takes nothing while step 1 starts: all three go to the slow one
    await _until(server.target, lambda r: _worker(r, "b-fast").memory_released, "the fast worker released")
    step = asyncio.create_task(collect_rollout(server.target, rollout_request(step=1, group=3, max_new_tokens=200)))
    r0, r1, r2 = (await slow.expect("assign")).assign.assignments
    slow.chunk(r0.request_id, r0.lease_epoch, 0, [5] * 10, finished=True, reason="stop")  # the group's prior: 10
    await _until(server.target, lambda r: r.finished == 3, "the first response of step 1")
    _heartbeat(fast, released=False)
    await _until(server.target, lambda r: not _worker(r, "b-fast").memory_released, "the fast worker back")
    server.clock_at.t += 10.0
    slow.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[_abort(r2, 5), _abort(r1, 100)])))  # r1 first in line

    on_fast = (await fast.expect("assign")).assign.assignments
    on_slow = (await slow.expect("assign")).assign.assignments
    long_to, short_to = (on_fast, on_slow) if speed_aware else (on_slow, on_fast)
    assert [a.request_id for a in long_to] == [r1.request_id]
    assert [a.request_id for a in short_to] == [r2.request_id]
    for w, a in ((fast, on_fast[0]), (slow, on_slow[0])):  # each continues from the tokens it was handed
        offset = 100 if a.request_id == r1.request_id else 5
        w.chunk(a.request_id, a.lease_epoch, offset, [5], finished=True, reason="stop")
    assert len(await step) == 3
    await slow.close()
    await fast.close()


async def test_weight_sync_time_runs_from_set_weight_version_to_the_report(timed_manager):
    server = timed_manager
    near = await WorkerClient(server.target, "near", capacity=1, heartbeats=False).connect()
    far = await WorkerClient(server.target, "far", capacity=1, heartbeats=False).connect()
    step = asyncio.create_task(collect_rollout(server.target, rollout_request(step=0, version=1, max_new_tokens=8)))
    for w in (near, far):
        assert (await w.expect("set_weight_version")).set_weight_version.weight_version == 1
    server.clock_at.t += 2.0
    near.send(pb.WorkerMessage(weight_version=pb.WeightVersionReport(weight_version=1)))
    await _until(server.target, lambda r: _worker(r, "near").weight_sync_s > 0, "the near worker's sync time")
    server.clock_at.t += 28.0
    far.send(pb.WorkerMessage(weight_version=pb.WeightVersionReport(weight_version=1)))
    reply = await _until(server.target, lambda r: _worker(r, "far").weight_sync_s > 0, "the far worker's sync time")
    assert _worker(reply, "near").weight_sync_s == pytest.approx(2.0)
    assert _worker(reply, "far").weight_sync_s == pytest.approx(30.0)
    a = (await near.expect("assign")).assign.assignments[0]
    near.chunk(a.request_id, a.lease_epoch, 0, [5], finished=True, reason="stop")
    assert len(await step) == 1
    await near.close()
    await far.close()


async def test_a_long_response_moves_off_the_slow_worker_to_the_idle_fast_one_keeping_its_tokens(timed_manager):
    """The step's last response runs on the slow worker (8 tokens/s) while the fast one (160 tokens/s) sits idle:
    the balancing pass revokes it for the fast worker (reason speed_rebalance), the slow worker flushes what it
    generated since, and the fast one continues from prompt + every token: none lost, none twice."""
    server = timed_manager
    slow = await WorkerClient(server.target, "a-slow", capacity=3, heartbeats=False).connect()
    fast = await WorkerClient(server.target, "b-fast", capacity=3, heartbeats=False).connect()
    await _measure_speeds(server, slow, fast)
    _heartbeat(fast, released=True)  # the fast one takes nothing while step 1 starts: its request goes to the slow one
    await _until(server.target, lambda r: _worker(r, "b-fast").memory_released, "the fast worker released")
    step = asyncio.create_task(collect_rollout(server.target, rollout_request(step=1, max_new_tokens=4000)))
    (a,) = (await slow.expect("assign")).assign.assignments
    slow.chunk(a.request_id, a.lease_epoch, 0, list(range(1, 101)))
    _heartbeat(fast, released=False)
    await _until(server.target, lambda r: not _worker(r, "b-fast").memory_released, "the fast worker back")

    server.balance_interval_s = 1.0  # 3900 tokens to come: 487 s on the slow one, 24 s (+ 2 s to move) on the fast
    server.clock_at.t += 2.0
    revoke = (await slow.expect("revoke")).revoke
    assert list(revoke.request_ids) == [a.request_id] and revoke.reason == "speed_rebalance"
    flush = pb.TokenChunk(
        request_id=a.request_id,
        lease_epoch=a.lease_epoch,
        offset=100,
        token_ids=list(range(101, 121)),
        logprobs=[-0.5] * 20,
        finish_reason="abort",
    )
    slow.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[flush])))

    (moved,) = (await fast.expect("assign")).assign.assignments
    assert moved.request_id == a.request_id and moved.lease_epoch > a.lease_epoch
    assert list(moved.input_ids) == list(a.input_ids) + list(range(1, 121)) and moved.prompt_len == len(a.input_ids)
    fast.chunk(moved.request_id, moved.lease_epoch, 120, list(range(121, 126)), finished=True, reason="stop")
    (trajectory,) = await step
    assert list(trajectory.response_ids) == list(range(1, 126))
    assert list(trajectory.workers) == ["a-slow", "b-fast"]
    assert (await status(server.target)).migrations_by_reason["speed_rebalance"] == 1
    await slow.close()
    await fast.close()
