"""Colocation in a real `python -m rollout_worker` process with a real nats-server: a release command is acked,
MACed with the ack key the manager's Registered gave (rlboost.auth.colocation_acks), (engine memory released, shown on /metrics, every heartbeat says `memory_released` from before the ack), work that
arrives meanwhile waits, and a resume is acked (heartbeats say resumed) and the worker generates again, token for token as
before. The manager side is the in-test stand-in
(standin_manager.py) because services never import each other; the trainer side is this test on NATS."""

from __future__ import annotations

import asyncio
import re

import httpx
import nats
import pytest

from rlboost.auth.colocation_acks import AckVerifier, worker_ack_key
from rlboost.nats_server import free_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.events import COLOCATION, COLOCATION_ACKS, ColocationAck, ColocationCommand
from tests.rollout_worker.standin_manager import StandInManager
from tests.rollout_worker.test_session import PROMPT, REGISTERED, eventually, pb_assignment
from tests.rollout_worker.test_torch_engine import hf_greedy
from tests.rollout_worker.test_worker_process import spawn, worker_argv

JOB = "colo"
COLOCATION_KEY = b"the-jobs-colocation-key"  # what the trainer and the manager would read from colocation.key


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} not on /metrics"
    return float(m.group(1))


async def scrape(port: int) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"http://127.0.0.1:{port}/metrics")).text


@pytest.fixture
def colocated_config(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("trainer:\n  colocateReserved: true\nrollout:\n  reserved: {replicas: 1, capacity: 2}\n")
    return path


async def test_release_is_acked_work_waits_and_resume_generates_again(
    tiny_model_dir, tmp_path, nats_server, colocated_config
):
    mport, metrics_port = free_port(), free_port()
    registered = pb.Registered(colocation_ack_key=worker_ack_key(COLOCATION_KEY, JOB, "reserved-0"))
    registered.MergeFrom(REGISTERED)
    manager = await StandInManager(registered).start(mport)
    nc = await nats.connect(nats_server.url)
    acks: asyncio.Queue[ColocationAck] = asyncio.Queue()

    async def on_ack(msg) -> None:
        acks.put_nowait(ColocationAck.model_validate_json(msg.data))

    await nc.subscribe(COLOCATION_ACKS.subject("default", JOB), cb=on_ack)
    argv = worker_argv(
        tiny_model_dir,
        mport,
        metrics_port,
        nats_url=nats_server.url,
        job=JOB,
        config=str(colocated_config),
        pool="reserved",
        worker_id="reserved-0",
    )
    proc = spawn(argv, tmp_path / "worker.log")
    try:
        await eventually(lambda: manager.registrations, timeout=60, what="registration")
        manager.assign(pb_assignment("before", PROMPT, 10))
        await eventually(lambda: (c := manager.last_chunk("before")) and c.finished, timeout=30, what="first run")

        async def command(action: str) -> ColocationAck:
            cmd = ColocationCommand(step=4, action=action, weight_version=0)
            await nc.publish(COLOCATION.subject("default", JOB), cmd.model_dump_json().encode())
            return await asyncio.wait_for(acks.get(), 30)

        beats_before = len(manager.of_kind("heartbeat"))
        ack = await command("release")
        assert (ack.worker_id, ack.step, ack.action, ack.ok, ack.released) == ("reserved-0", 4, "release", True, True)
        assert AckVerifier(COLOCATION_KEY, JOB).refusal(ack) is None, "the ack is not MACed with its own key"
        # The manager is told (a heartbeat sent before the release, not a period later) that it takes no work.
        beats = lambda: [m.heartbeat.memory_released for m in manager.of_kind("heartbeat")]  # noqa: E731
        await eventually(lambda: True in beats()[beats_before:], what="a released heartbeat")
        first_released = beats().index(True, beats_before)
        assert ack.nbytes > 0
        text = await scrape(metrics_port)
        assert metric(text, "rlboost_worker_memory_released") == 1
        assert metric(text, "rlboost_worker_memory_released_bytes") == ack.nbytes
        assert metric(text, "rlboost_worker_memory_release_seconds_count") == 1

        manager.assign(pb_assignment("during", PROMPT, 10))  # held: the engine has no weights now
        await eventually(lambda: beats()[first_released + 3 :], what="heartbeats while released")
        assert all(beats()[first_released:])
        assert manager.tokens("during") == []

        beats_released = len(manager.of_kind("heartbeat"))
        ack = await command("resume")
        assert (ack.action, ack.ok, ack.released) == ("resume", True, False)
        assert AckVerifier(COLOCATION_KEY, JOB).refusal(ack) is None
        await eventually(lambda: False in beats()[beats_released:], what="a resumed heartbeat")
        await eventually(lambda: (c := manager.last_chunk("during")) and c.finished, timeout=30, what="held run")
        assert manager.tokens("during") == manager.tokens("before") == hf_greedy(tiny_model_dir, PROMPT, 10)
        text = await scrape(metrics_port)
        assert metric(text, "rlboost_worker_memory_released") == 0
        assert metric(text, "rlboost_worker_memory_resume_seconds_count") == 1
        log = (tmp_path / "worker.log").read_text()
        assert "engine memory released for training" in log and "engine memory resumed after training" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await nc.close()
        await manager.stop()


async def test_spot_worker_ignores_colocation(tiny_model_dir, tmp_path, nats_server, colocated_config):
    """Only reserved workers share the trainer's accelerators: a spot worker does not subscribe or ack."""
    mport = free_port()
    manager = await StandInManager(REGISTERED).start(mport)
    nc = await nats.connect(nats_server.url)
    got: list[bytes] = []

    async def on_ack(msg) -> None:
        got.append(msg.data)

    await nc.subscribe(COLOCATION_ACKS.subject("default", JOB), cb=on_ack)
    argv = worker_argv(tiny_model_dir, mport, 0, nats_url=nats_server.url, job=JOB, config=str(colocated_config))
    proc = spawn(argv, tmp_path / "worker.log")
    try:
        await eventually(lambda: manager.registrations, timeout=60, what="registration")
        cmd = ColocationCommand(step=0, action="release")
        await nc.publish(COLOCATION.subject("default", JOB), cmd.model_dump_json().encode())
        await nc.flush()
        manager.assign(pb_assignment("g", PROMPT, 6))  # it keeps generating: it was never released
        await eventually(lambda: (c := manager.last_chunk("g")) and c.finished, timeout=30, what="generation")
        assert got == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await nc.close()
        await manager.stop()
