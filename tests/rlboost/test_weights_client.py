"""rlboost.weights.client against a real weight-server on loopback (uvicorn in a thread), including a pull
whose connection is cut mid-chunk by a real TCP proxy; and rlboost.weights.safetensors_io round trips."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest
import torch

from rlboost.nats_server import free_port
from rlboost.weights.checksum import state_checksum
from rlboost.weights.client import WeightClient, WeightServerError, _chunks_tile
from rlboost.weights.safetensors_io import state_from_bytes, state_to_bytes, to_publish_dtype
from tests.weight_server.servers import TOKEN, CuttingProxy, ThreadServer

CHUNK = 64 << 10


@pytest.fixture
def server(tmp_path):
    with ThreadServer(tmp_path / "data", chunk_bytes=CHUNK) as srv:
        yield srv


async def test_upload_pull_plan_and_wait(server, tmp_path) -> None:
    full = os.urandom(CHUNK * 5 + 123)
    delta_file = tmp_path / "delta.bin"
    delta_file.write_bytes(os.urandom(5000))
    async with WeightClient(server.url, token=TOKEN, streams=4) as wc:
        waiter = asyncio.create_task(wc.wait_for_version(1, timeout=20))
        m0 = await wc.upload(0, full, kind="full", checksum="c0")
        assert (m0.total_bytes, len(m0.chunks), m0.sha256) == (len(full), 6, hashlib.sha256(full).hexdigest())
        m1 = await wc.upload(1, delta_file, kind="delta", checksum="c1", base_version=0)
        assert (m1.kind, m1.base_version, m1.format) == ("delta", 0, "rlboost-delta")
        assert (await asyncio.wait_for(waiter, 20)).versions == [0, 1]
        assert await wc.pull(0) == full
        assert wc.last_pull.requests == 6 and wc.last_pull.retries == 0
        assert await wc.pull(m1) == delta_file.read_bytes()
        assert [m.version for m in await wc.sync_plan(0, 1)] == [1]
        assert [m.version for m in await wc.sync_plan(None)] == [0, 1]
        assert (await wc.manifest(1)) == m1


async def test_pull_resumes_a_chunk_after_the_connection_is_cut(server) -> None:
    payload = os.urandom(CHUNK * 16)
    async with WeightClient(server.url, token=TOKEN) as wc:
        await wc.upload(0, payload, checksum="c")
    # the proxy aborts the first connection to carry 100 kB: inside the second chunk served on it
    proxy = CuttingProxy(server.port, cut_after=100_000)
    async with proxy, WeightClient(f"http://127.0.0.1:{proxy.port}", streams=4) as wc:
        assert await wc.pull(0) == payload
        stats = wc.last_pull
    assert proxy.cuts == 1 and stats.retries >= 1
    assert any(off % CHUNK for off in stats.resumed_offsets), stats  # resumed mid-chunk, not from its start


async def test_corrupt_chunk_on_disk_is_refetched_then_refused(server) -> None:
    payload = os.urandom(CHUNK * 2)
    async with WeightClient(server.url, token=TOKEN, retries=3, backoff_max=0.05) as wc:
        await wc.upload(0, payload, checksum="c")
        with open(server.store.payload_path(0), "r+b") as f:  # bit rot after the manifest was written
            f.seek(CHUNK + 7)
            f.write(b"\x00" if payload[CHUNK + 7] else b"\x01")
        with pytest.raises(WeightServerError, match="chunk 1: gave up after 3 tries"):
            await wc.pull(0)
        assert wc.last_pull.retries == 2


async def test_refusals_raise_weight_server_error(server) -> None:
    async with WeightClient(server.url) as anon, WeightClient(server.url, token=TOKEN) as wc:
        with pytest.raises(WeightServerError) as err:
            await anon.upload(0, b"x", checksum="c")
        assert (err.value.status, err.value.field) == (401, "Authorization")
        await wc.upload(0, b"x", checksum="c")
        with pytest.raises(WeightServerError) as err:
            await wc.upload(0, b"x", checksum="c")
        assert err.value.status == 409 and "already exists" in str(err.value)
        with pytest.raises(WeightServerError) as err:
            await wc.manifest(9)
        assert err.value.status == 404
        with pytest.raises(TimeoutError):
            await wc.wait_for_version(5, timeout=0.3)
    async with WeightClient(f"http://127.0.0.1:{free_port()}", timeout=5) as nobody:
        with pytest.raises(WeightServerError, match="cannot reach") as err:
            await nobody.versions()
        assert err.value.status == 0
        with pytest.raises(WeightServerError, match="upload of version 0 failed") as err:
            await nobody.upload(0, b"x" * 3_000_000, checksum="c")
        assert err.value.status == 0


def test_safetensors_round_trip_keeps_every_bit() -> None:
    special = torch.tensor([float("nan"), -0.0, 0.0, float("inf"), -float("inf"), 1e-40, 3.5])
    state = {
        "b": special.to(torch.bfloat16),
        "a": torch.randn(3, 4),
        "h": special.to(torch.float16),
        "i": torch.arange(6, dtype=torch.int64).reshape(2, 3),
    }
    back = state_from_bytes(state_to_bytes(state))
    assert state_checksum(back) == state_checksum(state)
    with pytest.raises(ValueError, match="not a valid safetensors payload"):
        state_from_bytes(b"garbage")


def test_to_publish_dtype_casts_floats_and_keeps_bf16_bits() -> None:
    bf = torch.tensor([float("nan"), -0.0, 1.5], dtype=torch.bfloat16)
    state = {"bf": bf, "f32": torch.tensor([1.0, 2.5]), "i": torch.tensor([1, 2])}
    out = to_publish_dtype(state)
    assert {k: v.dtype for k, v in out.items()} == {"bf": torch.bfloat16, "f32": torch.bfloat16, "i": torch.int64}
    assert torch.equal(out["bf"].view(torch.int16), bf.view(torch.int16))
    assert to_publish_dtype(state, torch.float16)["f32"].dtype == torch.float16


async def test_a_manifest_whose_chunks_do_not_tile_the_payload_is_checked_whole(server) -> None:
    """Normally every byte is checked once, by its chunk's sha256 (no second pass over the payload); a manifest
    whose chunks leave a gap or overlap falls back to the whole payload's sha256, and a mismatch is refused."""
    full = os.urandom(CHUNK * 3)
    async with WeightClient(server.url, token=TOKEN) as wc:
        m = await wc.upload(0, full, kind="full", checksum="c0")
        assert _chunks_tile(m) and await wc.pull(m) == full
        gap = m.model_copy(update={"chunks": m.chunks[:1] + m.chunks[2:]})  # the middle chunk's bytes unchecked
        assert not _chunks_tile(gap)
        with pytest.raises(WeightServerError, match="payload sha256 does not match its manifest"):
            await wc.pull(gap)  # the middle chunk was never fetched: only the whole payload's sha256 can tell
