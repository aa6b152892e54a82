"""A starting worker's first pull rides out a weight-server that goes away and comes back (the all-services chaos
run killed the weight-server while a new spot worker pulled its first version, and the worker exited). A real
weight-server on loopback (uvicorn in a thread) is stopped right after it told the worker its newest version, and
started again on the same port and data once the worker retries; the pull completes with the exact weights. A
weight-server that stays away, or an error that is not transient, still ends the start with a clear error."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rlboost.nats_server import free_port
from rlboost.weights.client import WeightClient, WeightServerError
from rlboost.weights.safetensors_io import state_to_bytes
from rollout_worker.weights import WeightPuller, transient
from tests.helpers import wait_until_async
from tests.weight_server.servers import TOKEN, ThreadServer
from tests.weight_server.states import chain, checksum


def _server(data, port: int) -> ThreadServer:
    srv = ThreadServer(data)
    srv.port, srv.url = port, f"http://127.0.0.1:{port}"
    return srv


async def test_the_first_pull_waits_out_a_weight_server_restart(tmp_path, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="rollout_worker.weights")
    port, states = free_port(), chain(1)
    first = _server(tmp_path / "data", port).start()
    async with WeightClient(first.url, token=TOKEN) as wc:
        await wc.upload(0, state_to_bytes(states[0]), kind="full", checksum=checksum(states[0]))
        puller = WeightPuller(wc)
        real_versions = wc.versions

        async def versions_then_the_server_dies():
            answer = await real_versions()
            await asyncio.to_thread(first.stop)  # gone between "version 0 is newest" and the pull of version 0
            return answer

        wc.versions = versions_then_the_server_dies
        pulling = asyncio.create_task(puller.pull_first(timeout_s=60))
        await wait_until_async(lambda: "weight-server unavailable; retrying" in caplog.text, 30, what="a retry")
        wc.versions = real_versions
        second = _server(tmp_path / "data", port).start()  # the same port and data: a restarted weight-server
        try:
            pulled = await asyncio.wait_for(pulling, 60)
        finally:
            second.stop()
    assert pulled.version == 0 and pulled.checksum == checksum(states[0])


async def test_a_weight_server_that_stays_away_ends_the_first_pull_at_the_timeout(tmp_path) -> None:
    with ThreadServer(tmp_path / "data") as srv:
        async with WeightClient(srv.url, token=TOKEN) as wc:
            states = chain(1)
            await wc.upload(0, state_to_bytes(states[0]), kind="full", checksum=checksum(states[0]))

            async def no_plan(*_):
                raise WeightServerError(503, "restarting")

            wc.sync_plan = no_plan
            with pytest.raises(WeightServerError, match="restarting"):
                await WeightPuller(wc).pull_first(timeout_s=1.0)


def test_only_unreachable_and_server_errors_are_transient() -> None:
    assert transient(WeightServerError(0, "cannot reach")) and transient(WeightServerError(502, "bad gateway"))
    assert not transient(WeightServerError(404, "no such version")) and not transient(ValueError("x"))
