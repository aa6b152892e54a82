"""Bounds and failures over real gRPC (loopback): what a forged or broken worker streams is refused and never
reaches the trainer, a Rollout call's size is bounded, a duplicate Rollout leaves the first call untouched,
trajectory batches are cut by bytes, a request fails after its attempts (fail or drop), a stalled request migrates.

The workers are in-test clients speaking the generated stubs; the manager is the real server.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array

import grpc
import pytest

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from rlboost.spec import RolloutSpec
from rlboost.wire.rollout_io import Trajectory
from rlboost.wire.rollout_proto import TRAJECTORY_BATCH_BYTES
from rollout_manager.server import RolloutManagerServer, _batches

from .client import SAFETY_LEASE_MS, ManualClock, WorkerClient, collect_rollout, rollout_request
from .test_server import _is, _tokens_received, metric, wait_for

VOCAB = 1000


def _send(
    w: WorkerClient, rid: str, epoch: int, offset: int, tokens: list[int], logprobs: list[float], packed=False, **kw
) -> None:
    """`packed`: the tokens in TokenChunk.*_packed (int32 / float32 little-endian), as a current worker sends them."""
    c = pb.TokenChunk(request_id=rid, lease_epoch=epoch, offset=offset, **kw)
    if packed:
        c.token_ids_packed, c.logprobs_packed = array("i", tokens).tobytes(), array("f", logprobs).tobytes()
    else:
        c.token_ids.extend(tokens)
        c.logprobs.extend(logprobs)
    w.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[c])))


def _request(**kw) -> pb.RolloutRequest:
    req = rollout_request(**kw)
    req.vocab_size = VOCAB
    return req


async def _assignments(w: WorkerClient, n: int) -> list[pb.Assignment]:
    """The first `n` assignments, however many AssignBatch messages the scheduler's passes made of them."""
    out: list[pb.Assignment] = []
    while len(out) < n:
        out += (await w.expect("assign")).assign.assignments
    return out


async def _all(call) -> list[pb.TrajectoryBatch]:
    return [b async for b in call]


@pytest.fixture
async def make_manager():
    """Start a manager with balancing off, a safety-net lease (client.SAFETY_LEASE_MS) and these spec fields."""
    servers: list[RolloutManagerServer] = []

    async def start(clock=time.monotonic, **fields) -> RolloutManagerServer:
        spec = RolloutSpec(**{"heartbeat_interval_ms": 50, "lease_timeout_ms": SAFETY_LEASE_MS, **fields})
        server = RolloutManagerServer(spec, balance_interval_s=3600.0, clock=clock)
        server.target = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop(grace=0)


@pytest.mark.parametrize(
    ("tokens", "logprobs", "problem"),
    [
        ([VOCAB, 2147483647, 0], [-0.1, -0.1, -0.1], "token_id"),
        ([1, 2, 3], [-0.1, 1e30, -0.1], "logprob"),
        ([1, 2, 3], [-0.1, -1e30, -0.1], "logprob"),
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["repeated", "packed"])
async def test_forged_output_is_refused_and_the_request_continues_elsewhere(manager, tokens, logprobs, problem, packed):
    forged = await WorkerClient(manager.target, "forged", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, _request(max_new_tokens=4)))
    a1 = (await forged.expect("assign")).assign.assignments[0]
    honest = await WorkerClient(manager.target, "honest", capacity=1).connect()  # idle: the request's next worker
    _send(forged, a1.request_id, a1.lease_epoch, 0, [7], [-0.5])  # a good token first: kept
    refused = metric("rlboost_manager_rejected_chunks_total", reason=problem)
    _send(forged, a1.request_id, a1.lease_epoch, 1, tokens, logprobs, packed, finished=True, finish_reason="stop")
    revoke = (await forged.expect("revoke")).revoke
    assert list(revoke.request_ids) == [a1.request_id] and revoke.reason == "invalid_output"
    assert metric("rlboost_manager_rejected_chunks_total", reason=problem) == refused + 1
    a2 = (await honest.expect("assign")).assign.assignments[0]
    assert a2.request_id == a1.request_id and list(a2.input_ids)[a2.prompt_len :] == [7]
    _send(honest, a2.request_id, a2.lease_epoch, 1, [8, 9, 10], [-0.2] * 3, finished=True, finish_reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [7, 8, 9, 10] and all(math.isfinite(x) for x in traj.logprobs)
    assert list(traj.workers) == ["forged", "honest"]
    await honest.close()
    await forged.close()


@pytest.mark.parametrize(
    ("tokens", "logprobs"), [([-5, 2147483647, 0], [-0.1] * 3), ([1, 2, 3], [math.nan, math.inf, 0])]
)
async def test_malformed_output_ends_the_forged_stream_and_never_reaches_the_trainer(manager, tokens, logprobs):
    forged = await WorkerClient(manager.target, "forged", capacity=1).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, _request(max_new_tokens=3)))
    a1 = (await forged.expect("assign")).assign.assignments[0]
    _send(forged, a1.request_id, a1.lease_epoch, 0, tokens, logprobs, finished=True, finish_reason="stop")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await forged.expect("assign")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk." in err.value.details()
    honest = await WorkerClient(manager.target, "honest", capacity=1).connect()
    a2 = (await honest.expect("assign")).assign.assignments[0]
    _send(honest, a2.request_id, a2.lease_epoch, 0, [4, 5, 6], [-0.2] * 3, finished=True, finish_reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [4, 5, 6] and list(traj.workers) == ["honest"]
    await honest.close()
    forged.stop_heartbeats()


async def test_worker_reported_failure_migrates_and_refused_input_fails_at_once(make_manager):
    manager = await make_manager(max_request_attempts=3, on_failed_request="drop")
    rollout = asyncio.create_task(collect_rollout(manager.target, _request(group=2, max_new_tokens=2)))
    w1 = await WorkerClient(manager.target, "w1", capacity=2).connect()
    flaky, refused = await _assignments(w1, 2)
    w2 = await WorkerClient(manager.target, "w2", capacity=2).connect()
    _send(w1, flaky.request_id, flaky.lease_epoch, 0, [3], [-0.1], finish_reason="abort", error="CUDA error")
    _send(
        w1,
        refused.request_id,
        refused.lease_epoch,
        0,
        [],
        [],
        finish_reason="abort",
        error="prompt token 99999 outside the vocabulary",
        invalid_input=True,
    )
    again = (await w2.expect("assign")).assign.assignments[0]  # not w1: it failed there
    assert again.request_id == flaky.request_id and list(again.input_ids)[again.prompt_len :] == [3]
    _send(w2, again.request_id, again.lease_epoch, 1, [4], [-0.1], finished=True, finish_reason="length")
    trajs = {t.request_id: t for t in await asyncio.wait_for(rollout, 5)}
    assert list(trajs[flaky.request_id].response_ids) == [3, 4] and trajs[flaky.request_id].finish_reason == "length"
    assert trajs[refused.request_id].finish_reason == "failed"  # one attempt: every worker would refuse it
    assert manager.state.tally.migrations_by_reason["worker_failed"] == 2
    await w1.close()
    await w2.close()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: setattr(r, "group_size", 200_000), "rollout.group_size"),
        (lambda r: r.prompts[0].token_ids.extend([5] * 9000), "rollout.prompts[0]"),
        (lambda r: r.prompts[0].token_ids.append(VOCAB), "rollout.prompts[0]"),
        (lambda r: r.prompts[0].token_ids.append(-1), "rollout.prompts[0]"),  # refused by the wire conversion
        (lambda r: setattr(r.sampling, "max_new_tokens", 1 << 30), "sampling.max_new_tokens"),
        (lambda r: setattr(r, "vocab_size", -3), "rollout.vocab_size"),
    ],
)
async def test_rollout_call_bounds_are_invalid_argument_naming_the_field(manager, change, field):
    request = _request()
    change(request)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(collect_rollout(manager.target, request), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()


async def test_requests_per_step_are_bounded_by_the_spec(make_manager):
    strict_manager = await make_manager(max_step_requests=100)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(collect_rollout(strict_manager.target, _request(prompts=11, group=10)), 5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "rollout.maxStepRequests" in err.value.details()


async def test_duplicate_rollout_is_refused_and_leaves_the_first_call_untouched(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=2).connect()
    first = asyncio.create_task(collect_rollout(manager.target, _request(step=5, group=2, max_new_tokens=1)))
    assigned = await _assignments(w1, 2)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(collect_rollout(manager.target, _request(step=5, group=2, max_new_tokens=1)), 5)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and "step 5" in err.value.details()
    for a in assigned:
        _send(w1, a.request_id, a.lease_epoch, 0, [3], [-0.1], finished=True, finish_reason="length")
    trajs = await asyncio.wait_for(first, 5)
    assert len(trajs) == 2
    await w1.close()


async def test_trajectory_batches_are_cut_by_bytes_over_the_wire(make_manager):
    manager = await make_manager()  # ~10 MB through one loop: the safety-net lease does not expire meanwhile
    tokens = 100_000  # ~0.6 MB per trajectory: 8 of them finish together, over one 4 MiB message
    w1 = await WorkerClient(manager.target, "w1", capacity=8).connect()
    async with grpc.aio.insecure_channel(manager.target) as ch:  # the client's default 4 MiB receive limit
        call = pb_grpc.RolloutManagerStub(ch).Rollout(_request(group=8, max_new_tokens=tokens))
        assigned = await _assignments(w1, 8)
        chunks = [
            pb.TokenChunk(
                request_id=a.request_id,
                lease_epoch=a.lease_epoch,
                offset=0,
                token_ids=[999] * tokens,
                logprobs=[-0.25] * tokens,
                finished=True,
                finish_reason="length",
            )
            for a in assigned
        ]
        w1.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=chunks)))
        batches = await asyncio.wait_for(_all(call), 10)
    assert sum(len(b.trajectories) for b in batches) == 8 and len(batches) >= 2
    assert all(b.ByteSize() <= TRAJECTORY_BATCH_BYTES for b in batches)
    await w1.close()


def test_batches_never_exceed_the_byte_limit_and_keep_every_trajectory():
    trajs = [
        Trajectory(f"r{i}", 0, i, 0, [1] * 10, [2] * (100 * (i % 7 + 1)), [-0.5] * (100 * (i % 7 + 1)), "length", 0, [])
        for i in range(50)
    ]
    batches = _batches(trajs, max_bytes=5000)
    assert [t.request_id for b in batches for t in b.trajectories] == [t.request_id for t in trajs]
    assert all(b.ByteSize() <= 5000 for b in batches) and len(batches) > 5


async def test_request_failing_its_attempts_fails_the_step_naming_it(make_manager):
    strict_manager = await make_manager(max_request_attempts=2, on_failed_request="fail")
    target = strict_manager.target
    failed = metric("rlboost_manager_failed_requests_total", reason="stream_broken")
    rollout = asyncio.create_task(collect_rollout(target, _request(group=2, max_new_tokens=2)))
    for attempt in range(2):
        w = await WorkerClient(target, f"w{attempt}", capacity=2).connect()
        await _assignments(w, 2)
        await w.drop()  # the worker dies with both requests: a failed attempt each
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(rollout, 5)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "failed 2 attempts" in err.value.details() and "rollout.maxRequestAttempts" in err.value.details()
    assert metric("rlboost_manager_failed_requests_total", reason="stream_broken") >= failed + 1
    assert strict_manager.state.pending == 0 and not strict_manager.state.has_step(0)


async def test_dropped_request_is_delivered_as_failed_and_the_rest_complete(make_manager):
    strict_manager = await make_manager(max_request_attempts=1, on_failed_request="drop")
    target = strict_manager.target
    rollout = asyncio.create_task(collect_rollout(target, _request(group=2, max_new_tokens=2)))
    w1 = await WorkerClient(target, "w1", capacity=2).connect()
    good, bad = await _assignments(w1, 2)
    _send(w1, good.request_id, good.lease_epoch, 0, [4, 5], [-0.1, -0.1], finished=True, finish_reason="length")
    _send(w1, bad.request_id, bad.lease_epoch, 0, [VOCAB + 1], [-0.1])  # invalid: its one attempt failed
    trajs = {t.request_id: t for t in await asyncio.wait_for(rollout, 5)}
    assert trajs[good.request_id].finish_reason == "length" and list(trajs[good.request_id].response_ids) == [4, 5]
    assert trajs[bad.request_id].finish_reason == "failed" and list(trajs[bad.request_id].response_ids) == []
    await w1.close()


async def _advance(manager: RolloutManagerServer, clock: ManualClock, seconds: float, *alive: str) -> None:
    """Move the manager's clock once each of `alive` has been heard at the current time: a jump shorter than the
    lease expires none of them, however late the loaded machine delivers their heartbeats."""
    await wait_for(lambda: _is(all(manager.state.workers[w].last_seen == clock.t for w in alive)), what="heartbeats")
    clock.t += seconds


async def test_stalled_request_migrates_although_its_worker_heartbeats(make_manager):
    """The manager runs on the test's clock: the stall timeout (1 s) and the revoke deadline (the lease, 2 s) pass
    when the test moves it, and the heartbeating workers' leases never do."""
    clock = ManualClock()
    strict_manager = await make_manager(clock=clock, request_stall_timeout_ms=1000, lease_timeout_ms=2000)
    target = strict_manager.target
    rollout = asyncio.create_task(collect_rollout(target, _request(max_new_tokens=3)))
    hung = await WorkerClient(target, "hung", capacity=1).connect()  # heartbeats, never generates
    a1 = (await hung.expect("assign")).assign.assignments[0]
    _send(hung, a1.request_id, a1.lease_epoch, 0, [6], [-0.3])
    await wait_for(lambda: _tokens_received(target, 1), what="the hung worker's one token")
    await _advance(strict_manager, clock, 1.001, "hung")  # no token for longer than the stall timeout
    revoke = (await hung.expect("revoke", timeout=5)).revoke
    assert list(revoke.request_ids) == [a1.request_id] and revoke.reason == "stalled"
    w2 = await WorkerClient(target, "w2", capacity=1).connect()
    await _advance(strict_manager, clock, 1.0, "hung", "w2")  # the revoke deadline in two steps, each under the lease
    await _advance(strict_manager, clock, 1.001, "hung", "w2")
    a2 = (await w2.expect("assign")).assign.assignments[0]  # at the revoke deadline: the hung worker never flushed
    assert a2.request_id == a1.request_id and list(a2.input_ids)[a2.prompt_len :] == [6]
    _send(w2, a2.request_id, a2.lease_epoch, 1, [7, 8], [-0.3] * 2, finished=True, finish_reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == [6, 7, 8]
    assert strict_manager.state.tally.migrations_by_reason["stalled"] == 1
    await w2.close()
    await hung.close()


def test_worker_reported_failure_is_a_failed_attempt_and_stale_reports_are_ignored():
    """The state machine alone (the worker's report arrives on a field the worker side adds)."""
    from rlboost.wire.rollout_io import Pool, PromptItem, RolloutRequest, SamplingParams, WorkerRegistration
    from rollout_manager.state import ManagerState
    from rollout_manager.steps import RequestPolicy

    st = ManagerState(lease_timeout_s=1.0, policy=RequestPolicy(max_attempts=2, drop_failed=True))
    for wid in ("a", "b"):
        st.register(WorkerRegistration(wid, Pool.SPOT, node=wid, capacity=1, weight_version=0), now=0.0)
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [1, 2])], 1, SamplingParams(max_new_tokens=4)), 0.0)
    st.schedule(0.0)
    ((first, box),) = st.take_outbox().items()
    a = box.assign[0]
    assert not st.on_request_failed(first, a.request_id, a.lease_epoch + 1, "engine error", 0.1)  # stale epoch
    assert st.on_request_failed(first, a.request_id, a.lease_epoch, "engine error", 0.1)
    st.schedule(0.1)
    ((second, box),) = st.take_outbox().items()
    assert second != first  # not given back to the worker it failed on while another can take it
    b = box.assign[0]
    assert st.on_request_failed(second, b.request_id, b.lease_epoch, "engine error", 0.2)
    (traj,) = st.take_delivered()
    assert traj.finish_reason == "failed" and st.tally.failed_requests == 1
    assert st.tally.migrations_by_reason == {"worker_failed": 2}


async def test_health_reflects_a_blocked_loop_and_a_dead_ticker():
    import time

    server = RolloutManagerServer(RolloutSpec(), balance_interval_s=3600.0, health_max_lag_s=0.3)
    await server.start("127.0.0.1", 0)
    try:
        assert server.healthy()
        time.sleep(0.6)  # the fault: something holds the manager's loop
        assert not server.healthy()
        await asyncio.wait_for(_until(server.healthy), 5)  # the loop turns again, the block ages out
        server._tasks[1].cancel()  # the ticker dies: leases would never expire
        await asyncio.wait_for(_until(lambda: not server.healthy()), 5)
    finally:
        await server.stop(grace=0)


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.02)
