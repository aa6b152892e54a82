"""The worker's Connect loop over real gRPC (loopback) against a stand-in manager (see standin_manager.py:
the real rollout-manager is written concurrently and services never import each other), with the real
torch engine on a tiny model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from rlboost.nats_server import free_port
from rlboost.options.worker import WorkerOptions
from rlboost.rollout.v1 import rollout_pb2 as pb
from rollout_worker.engine.torch_engine import TorchEngine
from rollout_worker.errors import IdentityProofUnreadableError, ManagerUnreachableError
from rollout_worker.session import WorkerSession
from tests.rollout_worker.standin_manager import StandInManager

PROMPT = [5, 9, 3, 17, 8]
REGISTERED = pb.Registered(heartbeat_interval_ms=50, lease_timeout_ms=2000, chunk_max_tokens=4, chunk_max_ms=20)


async def eventually(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition"):
    """The asyncio twin of tests.helpers.wait_until: poll with a deadline without blocking the loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pb_assignment(rid: str, input_ids: list[int], n: int, epoch: int = 1, temp: float = 0.0) -> pb.Assignment:
    sampling = pb.SamplingParams(temperature=temp, top_p=1.0, max_new_tokens=n, seed=3)
    return pb.Assignment(
        request_id=rid, lease_epoch=epoch, input_ids=input_ids, prompt_len=len(PROMPT), sampling=sampling
    )


@pytest.fixture
async def rig(tiny_model_dir):
    """A stand-in manager, a torch engine and a running worker session."""
    port = free_port()
    manager = await StandInManager(REGISTERED).start(port)
    engine = TorchEngine(capacity=4)
    await engine.start(str(tiny_model_dir))
    options = WorkerOptions(
        worker_id="w-1", pool="spot", node="node-a", manager=f"127.0.0.1:{port}", reconnect_timeout=10
    )
    session = WorkerSession(options, engine)
    task = asyncio.create_task(session.run())
    await eventually(lambda: manager.registrations, what="registration")
    try:
        yield manager, engine, session, task, port
        session.request_drain("test over", notice=False)
        await asyncio.wait_for(task, 10)
    finally:  # a server left running is finalised in some later test, which then fails on its warning
        await engine.close()
        await manager.stop()


def assert_contiguous(manager: StandInManager, rid: str, start: int = 0) -> None:
    offset = start
    for c in manager.chunks[rid]:
        assert c.offset == offset, f"chunk offsets of {rid} must continue without gaps"
        assert len(c.token_ids) <= REGISTERED.chunk_max_tokens
        assert len(c.logprobs) == len(c.token_ids)
        offset += len(c.token_ids)


async def test_register_assign_and_stream_chunks(rig):
    manager, engine, _, _, _ = rig
    reg = manager.registrations[0]
    assert (reg.worker_id, reg.pool, reg.node, reg.capacity, reg.engine) == ("w-1", pb.POOL_SPOT, "node-a", 4, "torch")
    manager.assign(pb_assignment("a", PROMPT, 10), pb_assignment("b", PROMPT[:3] + [1, 2], 7))
    await eventually(lambda: all(manager.last_chunk(r) and manager.last_chunk(r).finished for r in "ab"), what="ends")
    for rid, n in (("a", 10), ("b", 7)):
        assert_contiguous(manager, rid)
        assert len(manager.tokens(rid)) == n and manager.last_chunk(rid).finish_reason == "length"
    # Same tokens as the engine gives on its own.
    solo = [t async for s in engine.generate(_domain("solo", PROMPT, 10)) for t in s.token_ids]
    assert manager.tokens("a") == solo
    await eventually(lambda: len(manager.of_kind("heartbeat")) >= 2, what="heartbeats")
    assert all(len(m.chunks.chunks) >= 1 for m in manager.of_kind("chunks"))


async def test_continued_request_starts_at_its_offset(rig):
    manager, engine, _, _, _ = rig
    full = [t async for s in engine.generate(_domain("solo", PROMPT, 12)) for t in s.token_ids]
    manager.assign(pb_assignment("c", PROMPT + full[:5], 12, epoch=3))
    await eventually(lambda: manager.last_chunk("c") and manager.last_chunk("c").finished, what="end")
    assert manager.chunks["c"][0].offset == 5 and all(c.lease_epoch == 3 for c in manager.chunks["c"])
    assert_contiguous(manager, "c", start=5)
    assert full[:5] + manager.tokens("c") == full


async def test_revoke_flushes_with_an_unfinished_abort_chunk(rig):
    manager, engine, _, _, _ = rig
    manager.assign(pb_assignment("long", PROMPT, 3000))
    await eventually(lambda: len(manager.tokens("long")) >= 8, what="first tokens")
    manager.send(revoke=pb.Revoke(request_ids=["long"], reason="migrate"))
    await eventually(lambda: manager.last_chunk("long").finish_reason == "abort", what="abort chunk")
    last = manager.last_chunk("long")
    assert not last.finished, "a revoked request is not finished: the manager continues it elsewhere"
    assert_contiguous(manager, "long")
    assert 8 <= len(manager.tokens("long")) < 3000
    await eventually(lambda: engine.running == 0, what="engine idle")


async def test_drain_command_flushes_and_closes(rig):
    manager, _, session, task, _ = rig
    manager.assign(pb_assignment("long", PROMPT, 3000))
    await eventually(lambda: manager.tokens("long"), what="first tokens")
    manager.send(drain=pb.DrainCommand(reason="scale down"))
    await asyncio.wait_for(task, 10)
    assert session.draining and manager.streams_ended == 1
    last = manager.last_chunk("long")
    assert last.finish_reason == "abort" and not last.finished
    assert_contiguous(manager, "long")


async def test_reconnects_when_the_manager_restarts(rig):
    manager, _, session, _, port = rig
    manager.assign(pb_assignment("long", PROMPT, 3000))
    await eventually(lambda: manager.tokens("long"), what="first tokens")
    await manager.stop()
    await manager.start(port)  # same port: a restarted manager
    # The manager records a Register before answering it: wait for the worker's side of the handshake too.
    await eventually(lambda: session.registrations == 2 and len(manager.registrations) == 2, what="re-registration")
    # the response it was generating is paused and handed to the new manager whole: every token received, and
    # those the old manager never got (unflushed when the stream broke)
    (held,) = manager.registrations[1].held
    received = manager.tokens("long")
    assert (held.request_id, list(held.prompt_ids), held.finished) == ("long", PROMPT, False)
    assert list(held.token_ids[: len(received)]) == received and len(held.logprobs) == len(held.token_ids)
    manager.assign(pb_assignment("after", PROMPT, 5))
    await eventually(lambda: manager.last_chunk("after") and manager.last_chunk("after").finished, what="end")


async def test_drain_asked_while_registering_closes_the_new_stream(rig):
    """SIGTERM while the worker reconnects: the stream that comes up is drained at once, not served forever."""
    manager, _, session, task, port = rig
    await manager.stop()
    manager.answering.clear()
    await manager.start(port)
    await eventually(lambda: len(manager.registrations) == 2, what="second Register")
    session.request_drain("SIGTERM", notice=True)
    manager.answering.set()
    await asyncio.wait_for(task, 10)
    assert session.registrations == 2
    await eventually(lambda: manager.streams_ended == 2, what="the new stream closed by the worker")
    assert [m.drain.reason for m in manager.of_kind("drain")] == ["SIGTERM"]


async def test_unreachable_manager_is_reported(tiny_model_dir):
    engine = TorchEngine(capacity=1)
    await engine.start(str(tiny_model_dir))
    options = WorkerOptions(
        worker_id="w", pool="reserved", node="n", manager=f"127.0.0.1:{free_port()}", reconnect_timeout=1.0
    )
    with pytest.raises(ManagerUnreachableError, match="unreachable"):
        await asyncio.wait_for(WorkerSession(options, engine).run(), 15)
    await engine.close()


async def test_each_registration_presents_the_identity_proof_as_it_is_then(tiny_model_dir, tmp_path):
    """The kubelet renews a pod's projected token in place (an hourly token, renewed at 80% of its life): a worker
    that re-registers with a restarted manager must present the renewed token, not the one it started with."""
    port, token = free_port(), tmp_path / "token"
    token.write_text("proof-1\n")
    manager = await StandInManager(REGISTERED).start(port)
    engine = TorchEngine(capacity=1)
    await engine.start(str(tiny_model_dir))
    options = WorkerOptions(
        worker_id="w",
        pool="spot",
        node="n",
        manager=f"127.0.0.1:{port}",
        reconnect_timeout=10,
        identity_token_file=str(token),
    )
    session = WorkerSession(options, engine)
    task = asyncio.create_task(session.run())
    try:
        await eventually(lambda: session.registrations == 1, what="registration")
        token.write_text("proof-2\n")  # renewed while the stream is up: nothing is sent until the next Register
        await manager.stop()
        await manager.start(port)
        await eventually(lambda: session.registrations == 2, what="re-registration")
        assert [r.identity_proof for r in manager.registrations] == ["proof-1", "proof-2"]
        session.request_drain("test over", notice=False)
        await asyncio.wait_for(task, 10)
    finally:
        await engine.close()
        await manager.stop()


async def test_an_unreadable_identity_proof_ends_the_session_naming_the_flag(tiny_model_dir, tmp_path):
    """A worker whose --identity-token-file is gone stops with that flag named, not as an unreachable manager
    (the manager answers; it is the proof that is missing), and sends no Register without it."""
    port = free_port()
    manager = await StandInManager(REGISTERED).start(port)
    engine = TorchEngine(capacity=1)
    await engine.start(str(tiny_model_dir))
    missing = tmp_path / "identity" / "token"
    options = WorkerOptions(
        worker_id="w", pool="spot", node="n", manager=f"127.0.0.1:{port}", identity_token_file=str(missing)
    )
    try:
        with pytest.raises(IdentityProofUnreadableError, match=f"--identity-token-file {missing}: cannot read it"):
            await asyncio.wait_for(WorkerSession(options, engine).run(), 15)
        assert manager.registrations == []
    finally:
        await engine.close()
        await manager.stop()


def _domain(rid: str, input_ids: list[int], n: int):
    from rlboost.wire.rollout_proto import assignment_from_pb

    return assignment_from_pb(pb_assignment(rid, input_ids, n))


async def test_a_refused_request_ends_alone_and_its_last_chunk_carries_the_cause(rig):
    """Over real gRPC: the stand-in manager receives the bad request's last chunk with `error` and
    `invalid_input` (finished=false, "abort": a manager that ignores them migrates it as before); the good one
    beside it finishes."""
    manager, engine, _, _, _ = rig
    manager.assign(pb_assignment("bad", [5, 9, 64, 3, 17], 6), pb_assignment("good", PROMPT, 6))
    await eventually(lambda: manager.last_chunk("good") and manager.last_chunk("good").finished, what="good ends")
    await eventually(lambda: manager.last_chunk("bad"), what="bad ends")
    last = manager.last_chunk("bad")
    assert (last.finished, last.finish_reason, last.invalid_input) == (False, "abort", True)
    assert "input_ids[2] = 64 is outside the model's vocabulary" in last.error
    assert manager.tokens("bad") == [] and len(manager.tokens("good")) == 6
    assert manager.last_chunk("good").error == ""


def _kinds_between(manager: StandInManager, kind: str, start: float, end: float) -> list[float]:
    return [
        t
        for m, t in zip(manager.received, manager.received_at, strict=True)
        if m.WhichOneof("body") == kind and start <= t < end
    ]


async def test_heartbeats_are_skipped_while_chunks_flow(rig):
    """Chunks every 20 ms, heartbeat period 50 ms: the chunks say the worker is alive, so (almost) no heartbeat."""
    manager, _, _, _, _ = rig
    manager.assign(pb_assignment("long", PROMPT, 3000))
    await eventually(lambda: len(manager.tokens("long")) >= 8, what="first tokens")
    start = time.monotonic()
    await eventually(lambda: len(manager.tokens("long")) >= 400 or len(manager.of_kind("chunks")) >= 60, what="flow")
    end = time.monotonic()
    chunk_times = _kinds_between(manager, "chunks", start, end)
    beats = _kinds_between(manager, "heartbeat", start, end)
    gaps = [b - a for a, b in zip([start, *chunk_times], [*chunk_times, end], strict=True)]
    # a heartbeat is due only after a period (50 ms) with no chunk; allow one per such gap
    assert len(beats) <= sum(1 for g in gaps if g >= 0.045) + 1, (len(beats), len(chunk_times), end - start)
    assert len(beats) < (end - start) / 0.05 / 2
    manager.send(revoke=pb.Revoke(request_ids=["long"], reason="test over"))


async def test_the_worker_flushes_at_the_cadence_the_manager_sets(rig):
    """ChunkCadence replaces Registered's bounds mid-stream: batches then leave every 300 ms, far fuller."""
    manager, _, session, _, _ = rig
    manager.send(chunk_cadence=pb.ChunkCadence(chunk_max_tokens=4096, chunk_max_ms=300))
    await eventually(lambda: session.link and session.link.chunker.max_ms == 300, what="cadence applied")
    manager.assign(pb_assignment("a", PROMPT, 3000), pb_assignment("b", PROMPT, 3000))
    await eventually(lambda: len(manager.of_kind("chunks")) >= 4, what="4 batches")
    batches = [
        (m, t) for m, t in zip(manager.received, manager.received_at, strict=True) if m.WhichOneof("body") == "chunks"
    ]
    times = [t for _, t in batches]
    assert all(b - a >= 0.25 for a, b in zip(times, times[1:], strict=False)), times  # 300 ms by the worker's clock
    for m, _ in batches[1:]:  # every running request's tokens in each batch, many tokens per chunk
        assert {c.request_id for c in m.chunks.chunks} == {"a", "b"}
    assert max(len(c.token_ids) for m, _ in batches for c in m.chunks.chunks) > REGISTERED.chunk_max_tokens
    assert_contiguous_any_size(manager, "a")
    manager.send(revoke=pb.Revoke(request_ids=["a", "b"], reason="test over"))


def assert_contiguous_any_size(manager: StandInManager, rid: str) -> None:
    offset = 0
    for c in manager.chunks[rid]:
        assert c.offset == offset and len(c.logprobs) == len(c.token_ids)
        offset += len(c.token_ids)
