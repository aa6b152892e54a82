"""Peer weight fan-out against a real weight-server on loopback: pullers fetch from each other (pipelined), a peer
that lies is caught by the chunk hash, counted and avoided (a real peer process), a dead peer costs a retry."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import sys

import httpx
import pytest

from rlboost.weights.client import PEER_STALL_S, WeightClient
from rlboost.weights.fanout import PeerFanout
from tests.weight_server.servers import ROOT, TOKEN, ThreadServer

CHUNK = 64 << 10


@pytest.fixture
def server(tmp_path):
    with ThreadServer(tmp_path / "data", chunk_bytes=CHUNK) as srv:
        yield srv


def served_bytes(server: ThreadServer) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("rlboost_weights_bytes_served_total{")
    )


async def upload(server: ThreadServer, nbytes: int) -> bytes:
    payload = os.urandom(nbytes)
    async with WeightClient(server.url, token=TOKEN) as wc:
        await wc.upload(0, payload, checksum="c")
    return payload


async def peer(
    server: ThreadServer, tmp_path, name: str, zone: str = "z", region: str = "r", peer_timeout: float = PEER_STALL_S
):
    client = WeightClient(server.url, token=TOKEN, streams=4, peer_timeout=peer_timeout)
    fanout = PeerFanout(client, name, tmp_path / name, zone=zone, region=region, token=TOKEN)
    await fanout.start("127.0.0.1", 0)
    return client, fanout


@contextlib.asynccontextmanager
async def liar_process(server: ThreadServer, tmp_path, bad_chunk: int):
    """tests/rlboost/corrupt_peer.py as its own process, registered and serving; yields (process, its URL)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "tests.rlboost.corrupt_peer", server.url, "0", str(bad_chunk), str(tmp_path / "liar")]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.startswith("serving "), line
        yield proc, line.split()[1]
    finally:
        proc.kill()
        proc.communicate(timeout=10)


async def close(*pairs) -> None:
    for client, fanout in pairs:
        await fanout.close()
        await client.aclose()


async def test_a_wave_pulls_the_payload_from_the_server_once(server, tmp_path) -> None:
    payload = await upload(server, CHUNK * 24 + 5)
    peers = [await peer(server, tmp_path, f"w{i}") for i in range(4)]
    try:
        before = served_bytes(server)
        pulled = await asyncio.gather(*(client.pull(0) for client, _ in peers))
        assert all(p == payload for p in pulled)
        stats = [c.last_pull for c, _ in peers]
        assert served_bytes(server) - before == len(payload), stats  # the relay's pull; the chain served the rest
        assert sorted(f.relay_pulls for _, f in peers) == [0, 0, 0, 1]  # whichever asked first
        assert sorted(c.last_pull.peer_bytes for c, _ in peers) == [0] + [len(payload)] * 3
        late, late_fanout = await peer(server, tmp_path, "late", zone="z")
        await late_fanout._register()  # the holders reported at their heartbeat already; this is the puller
        assert await late.pull(0) == payload and late.last_pull.peer_bytes == len(payload)
        await close((late, late_fanout))
    finally:
        await close(*peers)


async def test_peer_reads_need_the_worker_token(server, tmp_path) -> None:
    await upload(server, CHUNK * 2)
    client, fanout = await peer(server, tmp_path, "w0")
    try:
        await client.pull(0)
        async with httpx.AsyncClient() as http:
            url = f"{fanout.url}/v1/versions/0/payload"
            assert (await http.get(url)).status_code == 401
            ok = await http.get(url, headers={"Authorization": f"Bearer {TOKEN}", "Range": "bytes=0-99"})
            assert ok.status_code == 206 and ok.headers["Content-Range"] == f"bytes 0-99/{CHUNK * 2}"
            missing = await http.get(
                f"{fanout.url}/v1/versions/7/payload", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert missing.status_code == 404 and missing.json()["field"] == "path"
    finally:
        await close((client, fanout))


async def test_a_peer_that_serves_a_corrupt_chunk_is_detected_counted_and_avoided(server, tmp_path) -> None:
    """The liar is a real process (tests/rlboost/corrupt_peer.py) serving one flipped byte in chunk 3."""
    payload = await upload(server, CHUNK * 8)
    async with liar_process(server, tmp_path, 3) as (_, liar_url):
        rejected: list[str] = []
        client, fanout = await peer(server, tmp_path, "honest")
        client.on_peer_rejected = rejected.append
        try:
            assert hashlib.sha256(await client.pull(0)).digest() == hashlib.sha256(payload).digest()
            assert rejected == [liar_url] and client.bad_peers == {liar_url}
            assert client.last_pull.peer_bytes < len(payload)
            assert await client.pull(0) == payload
            assert client.last_pull.peer_bytes == 0 and rejected == [liar_url]  # not asked again
        finally:
            await close((client, fanout))


async def test_a_dead_peer_costs_a_retry_not_the_sync(server, tmp_path) -> None:
    payload = await upload(server, CHUNK * 6)
    first, first_fanout = await peer(server, tmp_path, "w0")
    second, second_fanout = await peer(server, tmp_path, "w1")
    try:
        await first.pull(0)
        await first_fanout._register()
        await first_fanout.server.stop()  # gone without leaving: still listed until its heartbeat expires
        assert await second.pull(0) == payload
        assert second.last_pull.peer_bytes == 0 and second.last_pull.peer_failures >= 1
    finally:
        await close((first, first_fanout), (second, second_fanout))


async def test_a_frozen_peer_costs_the_peer_timeout_not_the_servers(server, tmp_path) -> None:
    """A peer frozen with its socket open (SIGSTOP: a VM gone without a TCP reset; the kernel still accepts
    connections for it) sends no byte: its chunk goes to the weight-server after `peer_timeout`, not after the
    server's 60 s read timeout, and later pulls skip it. The peer is a real process (tests/rlboost/corrupt_peer.py),
    frozen before any read."""
    payload = await upload(server, CHUNK * 2)
    async with liar_process(server, tmp_path, 0) as (frozen, frozen_url):
        frozen.send_signal(signal.SIGSTOP)
        client, fanout = await peer(server, tmp_path, "puller", peer_timeout=1.0)
        try:  # the deadline catches a pull held for the server's read timeout (60 s)
            assert await asyncio.wait_for(client.pull(0), 30) == payload
            assert client.last_pull.peer_bytes == 0 and client.last_pull.peer_failures >= 1
            # the directory lists it until its heartbeat expires; this client's next pulls do not wait on it again
            assert await asyncio.wait_for(client.pull(0), 30) == payload
            assert client.last_pull.peer_failures == 0 and list(client.down_peers) == [frozen_url]
        finally:
            await close((client, fanout))


async def test_a_frozen_peer_is_reported_and_the_next_new_worker_does_not_try_it(server, tmp_path) -> None:
    """A peer frozen with its socket open (a real process, SIGSTOPped) stalls the first puller sent to it for the
    peer timeout; that puller tells the directory, and a second, new worker (its own client: nothing learned
    locally) is not offered the frozen peer: it pulls from the first puller, without a failed try. Without the
    report, the directory listed the frozen peer until its heartbeat expired (30 s), and each new worker waited
    on it for its peer timeout (10 s by default)."""
    payload = await upload(server, CHUNK * 2)
    async with liar_process(server, tmp_path, 0) as (frozen, frozen_url):
        frozen.send_signal(signal.SIGSTOP)
        first, first_fanout = await peer(server, tmp_path, "first", peer_timeout=1.0)
        second, second_fanout = await peer(server, tmp_path, "second")
        told = second_fanout.sources
        offered: list[str] = []

        async def sources(m):
            found = await told(m)
            offered.extend(s.worker for s in found if s.worker)
            return found

        second_fanout.sources = sources
        try:
            assert await asyncio.wait_for(first.pull(0), 30) == payload
            assert first.last_pull.peer_failures >= 1 and frozen_url in first.down_peers
            await first_fanout.reports_sent()
            assert server.app.state.peers.peers["liar"].stalled_by == "first"  # the directory knows
            await first_fanout._register()  # holds the payload now (its heartbeat's news, without the wait)
            assert await asyncio.wait_for(second.pull(0), 30) == payload
            assert offered == ["first"] and second.last_pull.peer_failures == 0
            assert second.last_pull.peer_bytes == len(payload)  # all of it from the first puller
        finally:
            await close((first, first_fanout), (second, second_fanout))


async def test_a_puller_can_serve_the_payload_before_it_learns_its_sources(server, tmp_path) -> None:
    """The directory names a puller to those who ask after it as soon as it has asked, so the puller must already
    hold the payload's (empty) cache entry then: a peer without one answers 404, and every puller sent to it in
    that window took its chunks from the weight-server instead (seen under load: 8 of 24 chunks served twice)."""
    await upload(server, CHUNK * 4)
    client, fanout = await peer(server, tmp_path, "w0")
    asked = fanout.sources
    entry_when_asking: list[object] = []

    async def sources(m):
        entry_when_asking.append(fanout.cache.get(m.payload_path))
        return await asked(m)

    fanout.sources = sources
    try:
        await client.pull(0)
        assert entry_when_asking and entry_when_asking[0] is not None
    finally:
        await close((client, fanout))


def test_a_range_covers_exactly_the_chunks_it_overlaps(tmp_path) -> None:
    """The peer server waits for (and serves) the chunks a range overlaps, found by bisection over the offsets."""
    from rlboost.weights.peer_serve import CachedPayload
    from rlboost.wire.weights_io import ChunkInfo, Manifest

    chunks = [ChunkInfo(index=i, offset=i * 10, length=10, sha256="0" * 64) for i in range(5)]
    m = Manifest(version=0, kind="full", total_bytes=50, sha256="0" * 64, chunk_bytes=10, chunks=chunks, checksum="c")
    entry = CachedPayload(m, tmp_path / "p")
    try:
        assert entry.covers(0, 49) == [0, 1, 2, 3, 4]
        assert entry.covers(9, 10) == [0, 1] and entry.covers(10, 19) == [1] and entry.covers(35, 35) == [3]
        assert entry.covers(49, 49) == [4]
    finally:
        entry.close()
