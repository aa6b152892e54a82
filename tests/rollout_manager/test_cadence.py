"""Load-adaptive chunk cadence (rollout.maxChunkMessagesPerS) and chunks as a sign of life, over real gRPC.

The policy's arithmetic is checked on its own; then the real manager tells in-test workers (generated stubs) a
longer flush period as the fleet grows and the spec's own when it shrinks back, and keeps the lease of a worker
that sends only chunks.
"""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from rlboost.policies.cadence import CadenceTracker, ChunkBounds, chunk_bounds
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rollout_manager.server import RolloutManagerServer

from .client import WorkerClient, collect_rollout, rollout_request

SPEC = RolloutSpec(chunk_max_tokens=16, chunk_max_ms=50, max_chunk_messages_per_s=20)


def test_the_period_grows_with_the_fleet_within_its_bounds():
    assert chunk_bounds(1, SPEC) == ChunkBounds(16, 50)  # 1 x 1000 / 20 = 50 ms: the spec's own
    assert chunk_bounds(4, SPEC) == ChunkBounds(64, 200)  # tokens stretch by the same factor
    assert chunk_bounds(1000, SPEC) == ChunkBounds(320, 1000)  # capped at 1 s
    short_lease = SPEC.model_copy(update={"lease_timeout_ms": 2000})
    assert chunk_bounds(1000, short_lease).max_ms == 400  # a fifth of the lease
    fixed = SPEC.model_copy(update={"max_chunk_messages_per_s": 0})
    assert chunk_bounds(1000, fixed) == ChunkBounds(16, 50)  # 0: today's fixed cadence
    huge = SPEC.model_copy(update={"chunk_max_tokens": 1000})
    assert chunk_bounds(1000, huge).max_tokens == 4096


def test_tracker_announces_only_moves_past_the_hysteresis():
    tracker = CadenceTracker(SPEC)
    assert tracker.update(1) is None and tracker.current == ChunkBounds(16, 50)
    assert tracker.update(4) == ChunkBounds(64, 200)
    assert tracker.update(5) is None  # 250 ms is within 25% of 200: not worth telling every worker
    assert tracker.update(8) == ChunkBounds(128, 400)
    assert tracker.update(1) == ChunkBounds(16, 50)  # back to the spec's cadence exactly


async def _cadence(worker: WorkerClient, max_ms: int) -> pb.ChunkCadence:
    """The worker's next announced cadences until one has `max_ms` (earlier steps of a growing fleet skipped)."""
    while (msg := (await worker.expect("chunk_cadence")).chunk_cadence).chunk_max_ms != max_ms:
        pass
    return msg


async def test_workers_are_told_a_longer_period_as_the_fleet_grows_and_the_spec_s_when_it_shrinks():
    server = RolloutManagerServer(SPEC, balance_interval_s=3600.0)
    target = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
    try:
        first = await WorkerClient(target, "w1").connect()
        assert (first.registered.chunk_max_tokens, first.registered.chunk_max_ms) == (16, 50)
        others = [await WorkerClient(target, f"w{i}").connect() for i in (2, 3, 4)]
        for w in (first, *others):  # 4 workers x 1000 / 20 = 200 ms, every worker told
            assert (await _cadence(w, 200)).chunk_max_tokens == 64
        assert REGISTRY.get_sample_value("rlboost_manager_chunk_max_ms") == 200
        late = await WorkerClient(target, "w5").connect()  # 250 ms wanted: within the hysteresis, 200 stands
        assert (late.registered.chunk_max_tokens, late.registered.chunk_max_ms) == (64, 200)
        for w in (*others, late):
            await w.drop()
        assert (await _cadence(first, 50)).chunk_max_tokens == 16  # alone again: the spec's cadence
        await first.close()
    finally:
        await server.stop(grace=0)


async def test_a_worker_sending_only_chunks_keeps_its_lease(manager):
    """No heartbeat at all for 4 lease periods (300 ms): the chunks are its sign of life, nothing migrates."""
    worker = await WorkerClient(manager.target, "w1", capacity=1, heartbeats=False).connect()
    rollout = asyncio.create_task(collect_rollout(manager.target, rollout_request(max_new_tokens=13)))
    a = (await worker.expect("assign")).assign.assignments[0]
    for offset in range(12):
        worker.chunk(a.request_id, a.lease_epoch, offset, [offset + 1])
        await asyncio.sleep(0.1)  # the worker's own chunk cadence, not synchronisation
    worker.chunk(a.request_id, a.lease_epoch, 12, [13], finished=True, reason="length")
    (traj,) = await asyncio.wait_for(rollout, 5)
    assert list(traj.response_ids) == list(range(1, 14)) and list(traj.workers) == ["w1"]
    assert manager.state.workers["w1"].expired is False and manager.state.tally.migrations == 0
    await worker.close()
