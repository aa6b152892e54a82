"""`python -m rollout_worker` as a real process: SIGTERM drain, weight pulls from a real weight-server
subprocess with announcements over a real nats-server, and one-line start-up errors. The manager side is
the in-test stand-in (standin_manager.py): the real rollout-manager is written concurrently."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from rlboost.nats_server import free_port, wait_for_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.weights.checksum import state_checksum
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_to_bytes
from rollout_worker.engine.torch_engine import read_model_state
from tests.rollout_worker.standin_manager import StandInManager
from tests.rollout_worker.test_engine_contract import BACKENDS
from tests.rollout_worker.test_session import PROMPT, REGISTERED, eventually, pb_assignment
from tests.rollout_worker.test_torch_engine import hf_greedy

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def worker_argv(model_dir: Path, manager_port: int, metrics_port: int, **flags: str) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "rollout_worker",
        "--worker-id",
        "spot-7",
        "--pool",
        "spot",
        "--node",
        "node-x",
        "--manager",
        f"127.0.0.1:{manager_port}",
        "--model-dir",
        str(model_dir),
        "--metrics-port",
        str(metrics_port),
        "--capacity",
        "2",
        "--weight-server",
        "",
        "--nats-url",
        "",
        "--reconnect-timeout",
        "20",
    ]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", v]
    return argv


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=ENV)


async def wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    return await asyncio.wait_for(asyncio.to_thread(proc.wait), timeout)


async def spawn_weight_server(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    """`python -m weight_server` with upload token 'secret' on a free port, once it listens."""
    token = tmp_path / "token"
    token.write_text("secret")
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "weight_server",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "ws"),
        "--token-file",
        str(token),
        *flags,
    ]
    proc = spawn(argv, tmp_path / "ws.log")
    await asyncio.to_thread(wait_for_port, "127.0.0.1", port, 60, proc)
    return proc, port


async def generates_then_drains(manager: StandInManager, worker: subprocess.Popen, expected: list[int]) -> None:
    """A greedy request yields `expected` tokens; then SIGTERM drains the worker (its DrainNotice, not an engine's
    own SIGTERM handler: SGLang installs one when its request loop starts) and it exits 0."""
    manager.assign(pb_assignment("g", PROMPT, 12))
    await eventually(lambda: manager.last_chunk("g") and manager.last_chunk("g").finished, timeout=30, what="end")
    assert manager.tokens("g") == expected
    worker.send_signal(signal.SIGTERM)
    assert await wait_exit(worker, 10) == 0
    assert [m.drain.reason for m in manager.of_kind("drain")] == ["SIGTERM"]


def stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_drains_every_token_and_exits_zero(tiny_model_dir, tmp_path):
    mport, metrics_port = free_port(), free_port()
    manager = await StandInManager(REGISTERED).start(mport)
    proc = spawn(worker_argv(tiny_model_dir, mport, metrics_port), tmp_path / "worker.log")
    try:
        await eventually(lambda: manager.registrations, timeout=60, what="registration")
        reg = manager.registrations[0]
        assert (reg.worker_id, reg.pool, reg.node, reg.capacity) == ("spot-7", pb.POOL_SPOT, "node-x", 2)
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{metrics_port}/healthz")).status_code == 200
        manager.assign(pb_assignment("long", PROMPT, 3000))
        await eventually(lambda: len(manager.tokens("long")) >= 8, timeout=30, what="first tokens")
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        assert "rlboost_worker_tokens_generated_total" in text and "rlboost_worker_chunks_sent_total" in text

        proc.send_signal(signal.SIGTERM)
        # exits 0 within the drain deadline (10 s); that it did not wait for the long response is shown below by
        # the abort mid-response, not by a wall-clock bound (5.6 s at a load of 21 on 2 cores)
        assert await wait_exit(proc, 10) == 0
        await eventually(lambda: manager.streams_ended == 1, what="stream closed")
        notices = manager.of_kind("drain")
        assert len(notices) == 1 and notices[0].drain.reason == "SIGTERM"
        last = manager.last_chunk("long")
        assert last.finish_reason == "abort" and not last.finished
        offset = 0
        for c in manager.chunks["long"]:  # every token generated arrived, in order, before the exit
            assert c.offset == offset
            offset += len(c.token_ids)
        assert 8 <= offset < 3000
        # The drain notice precedes the final chunk on the stream.
        kinds = [m.WhichOneof("body") for m in manager.received]
        assert kinds.index("drain") < len(kinds) - 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await manager.stop()


@pytest.mark.slow
async def test_pulls_weights_and_follows_announcements(tiny_model_dir, tmp_path, nats_server):
    """Version 0 is pulled before registering; an announced version 1 is pulled, verified, applied and reported."""
    ws, ws_port = await spawn_weight_server(tmp_path, "--nats-url", nats_server.url, "--job", "wtest")
    mport = free_port()
    manager = await StandInManager(REGISTERED).start(mport)
    worker = None
    try:
        v0 = read_model_state(str(tiny_model_dir))
        gen = torch.Generator().manual_seed(5)
        v1 = {k: (v.float() + 0.2 * torch.randn(v.shape, generator=gen)).to(torch.bfloat16) for k, v in v0.items()}
        async with WeightClient(f"http://127.0.0.1:{ws_port}", token="secret") as wc:
            await wc.upload(0, state_to_bytes(v0), kind="full", checksum=state_checksum(v0))
            argv = worker_argv(
                tiny_model_dir,
                mport,
                free_port(),
                weight_server=f"http://127.0.0.1:{ws_port}",
                nats_url=nats_server.url,
                job="wtest",
            )
            worker = spawn(argv, tmp_path / "worker.log")
            await eventually(lambda: manager.registrations, timeout=60, what="registration")
            assert manager.registrations[0].weight_version == 0
            await eventually(lambda: manager.of_kind("heartbeat"), what="stream up")  # subscribed before registering
            await wc.upload(1, state_to_bytes(v1), kind="full", checksum=state_checksum(v1))
            report = (await eventually(lambda: manager.of_kind("weight_version"), timeout=30, what="report"))[0]
        assert report.weight_version.weight_version == 1
        assert report.weight_version.checksum == state_checksum(v1)
        await generates_then_drains(manager, worker, hf_greedy(tiny_model_dir, PROMPT, 12, state=v1))
    finally:
        stop(worker, ws)
        await manager.stop()


def test_model_dir_that_cannot_load_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "nope"}')
    out = subprocess.run(worker_argv(tmp_path, free_port(), 0), capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("rollout-worker: cannot load a model from")
    # The engine loads while the first weights are awaited: its failure ends the start-up at once, not after
    # --startup-timeout (here a weight-server that never comes up, waited for up to 10 minutes).
    argv = worker_argv(tmp_path, free_port(), 0, weight_server=f"http://127.0.0.1:{free_port()}", startup_timeout="600")
    out = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("rollout-worker: cannot load a model from")


def test_missing_model_dir_names_the_flag(tmp_path):
    out = subprocess.run(
        worker_argv(tmp_path / "nope", free_port(), 0), capture_output=True, text=True, env=ENV, timeout=60
    )
    assert out.returncode == 2 and "--model-dir" in out.stderr


@pytest.mark.parametrize("engine", BACKENDS)
async def test_a_worker_without_a_model_dir_pulls_the_model_from_the_weight_server(engine, tiny_model_dir, tmp_path):
    """A spot pod's worker: `--model-dir ''` and a weight-server holding the trainer's assets and version 0. It
    pulls config, tokenizer and weights from there alone and generates what the model itself would. The sglang
    parameter runs in the SGLang lane (see test_engine_contract.py): SGLang starts on dummy weights, then takes
    version 0 as a verified update."""
    from rlboost.models.layout import asset_files

    ws, ws_port = await spawn_weight_server(tmp_path, "--no-nats")
    mport = free_port()
    manager = await StandInManager(REGISTERED).start(mport)
    worker = None
    try:
        url = f"http://127.0.0.1:{ws_port}"
        argv = worker_argv("", mport, free_port(), weight_server=url, startup_timeout="120", engine=engine)
        assert argv[argv.index("--model-dir") + 1] == ""
        worker = spawn(argv, tmp_path / "worker.log")  # before the trainer: it waits for the first version
        v0 = read_model_state(str(tiny_model_dir))
        async with WeightClient(url, token="secret") as wc:  # what the trainer does at start
            for path in asset_files(tiny_model_dir):
                await wc.upload_asset(path.name, path.read_bytes())
            await wc.upload(0, state_to_bytes(v0), kind="full", checksum=state_checksum(v0))
        await eventually(lambda: manager.registrations, timeout=240, what="registration")
        assert (manager.registrations[0].weight_version, manager.registrations[0].engine) == (0, engine)
        assert "model assets pulled" in (tmp_path / "worker.log").read_text()
        await generates_then_drains(manager, worker, hf_greedy(tiny_model_dir, PROMPT, 12, state=v0))
    finally:
        stop(worker, ws)
        await manager.stop()


def test_without_a_model_dir_or_a_weight_server_the_worker_names_the_flag(tmp_path):
    out = subprocess.run(worker_argv("", free_port(), 0), capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode == 2 and "--model-dir ''" in out.stderr and "--weight-server" in out.stderr


STOP_DEADLINE_S = 10  # a stop is prompt: well inside `rlboost local`'s 10 s grace, far from --startup-timeout's 600


async def stops_at_once_on_sigterm(worker: subprocess.Popen, log: Path, waiting_for: str) -> None:
    """Once the log shows the worker waiting (`waiting_for`), SIGTERM (the job ended): exit 0 within seconds,
    saying so, instead of waiting or retrying on until its supervisor's SIGKILL."""
    await eventually(lambda: waiting_for in log.read_text(), timeout=60, what=waiting_for)
    worker.send_signal(signal.SIGTERM)
    assert await wait_exit(worker, STOP_DEADLINE_S) == 0
    assert "stopped before registering: the job ended" in log.read_text()


async def test_sigterm_stops_a_worker_still_waiting_for_its_first_version(tiny_model_dir, tmp_path, nats_server):
    """The job ends before the trainer published a version (a late spot worker in a short job)."""
    ws, ws_port = await spawn_weight_server(tmp_path, "--no-nats")
    argv = worker_argv(
        tiny_model_dir,
        free_port(),
        0,
        weight_server=f"http://127.0.0.1:{ws_port}",
        nats_url=nats_server.url,
        startup_timeout="600",
    )
    log = tmp_path / "worker.log"
    worker = spawn(argv, log)
    try:
        await stops_at_once_on_sigterm(worker, log, f"GET http://127.0.0.1:{ws_port}/v1/versions")
    finally:
        stop(worker, ws)


async def test_sigterm_stops_a_worker_whose_nats_went_away_with_the_job(tiny_model_dir, tmp_path):
    """The first version pulled, NATS already gone (stopped with the job, before the worker subscribed): the
    connect retries, and SIGTERM must end them rather than only mark a session that never runs as draining."""
    ws, ws_port = await spawn_weight_server(tmp_path, "--no-nats")
    try:
        v0 = read_model_state(str(tiny_model_dir))
        async with WeightClient(f"http://127.0.0.1:{ws_port}", token="secret") as wc:
            await wc.upload(0, state_to_bytes(v0), kind="full", checksum=state_checksum(v0))
        argv = worker_argv(
            tiny_model_dir,
            free_port(),
            0,
            weight_server=f"http://127.0.0.1:{ws_port}",
            nats_url=f"nats://127.0.0.1:{free_port()}",
            startup_timeout="600",
        )
        log = tmp_path / "worker.log"
        worker = spawn(argv, log)
        try:
            await stops_at_once_on_sigterm(worker, log, "NATS connection error; reconnecting")
        finally:
            stop(worker)
    finally:
        stop(ws)
