"""rlboost.weights.range_get against a real aiohttp server on loopback: bytes land in the caller's buffer, connections
are reused and replaced when the server closed them while idle, and a wrong or stalled answer fails the request;
over TLS (the job's real certificates) too, with a head and body the server sent in one write."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from rlboost.auth.credentials import generate
from rlboost.weights.range_get import RangeConnectionError, RangeReader

PAYLOAD = os.urandom(300_000)


async def _serve(
    handler, keepalive_s: float = 75.0, tls: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str, set]:
    peers: set = set()

    async def counted(request: web.Request) -> web.StreamResponse:
        peers.add(request.transport.get_extra_info("peername"))
        return await handler(request)

    app = web.Application()
    app.router.add_get("/p", counted)
    runner = web.AppRunner(app, keepalive_timeout=keepalive_s)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"{'https' if tls else 'http'}://127.0.0.1:{port}/p", peers


async def _ranged(request: web.Request, content_range: str = "") -> web.StreamResponse:
    start, end = (int(x) for x in request.headers["Range"].removeprefix("bytes=").split("-"))
    resp = web.StreamResponse(status=206)
    resp.headers["Content-Range"] = content_range or f"bytes {start}-{end}/{len(PAYLOAD)}"
    resp.content_length = end - start + 1
    await resp.prepare(request)
    await resp.write(PAYLOAD[start : end + 1])
    return resp


async def _three_ranges(reader: RangeReader, url: str) -> bytearray:
    """PAYLOAD in three ranges, each into its place in one buffer; each answer a whole 206."""
    buf = bytearray(len(PAYLOAD))
    for start, end in [(0, 99_999), (100_000, 249_999), (250_000, len(PAYLOAD) - 1)]:
        reply = await reader.get_into(url, start, end, memoryview(buf)[start : end + 1])
        assert (reply.status, reply.received) == (206, end - start + 1)
    return buf


async def test_ranges_land_in_the_buffer_over_one_reused_connection() -> None:
    runner, url, peers = await _serve(_ranged)
    reader = RangeReader(timeout=10)
    try:
        assert await _three_ranges(reader, url) == PAYLOAD
    finally:
        await reader.close()
        await runner.cleanup()
    assert len(peers) == 1  # one connection, kept alive


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    runner, url, peers = await _serve(_ranged, keepalive_s=0.2)
    reader = RangeReader(timeout=10)
    buf = bytearray(1000)
    try:
        await reader.get_into(url, 0, 999, memoryview(buf))
        conn = reader._idle[("http", "127.0.0.1", int(url.split(":")[2].split("/")[0]))][0]
        deadline = asyncio.get_running_loop().time() + 10
        while not conn.closed:  # the server's keep-alive runs out
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        reply = await reader.get_into(url, 1000, 1999, memoryview(buf))
    finally:
        await reader.close()
        await runner.cleanup()
    assert reply.received == 1000 and buf == PAYLOAD[1000:2000] and len(peers) == 2


async def test_an_answer_for_another_range_is_refused() -> None:
    async def wrong(request: web.Request) -> web.StreamResponse:
        return await _ranged(request, content_range=f"bytes 5-1004/{len(PAYLOAD)}")

    runner, url, _ = await _serve(wrong)
    reader = RangeReader(timeout=10)
    try:
        with pytest.raises(RangeConnectionError, match="not the range asked for"):
            await reader.get_into(url, 0, 999, memoryview(bytearray(1000)))
    finally:
        await reader.close()
        await runner.cleanup()


async def test_an_error_status_brings_its_body_and_a_stall_fails_with_the_bytes_received() -> None:
    stalled = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers["Range"] == "bytes=0-9":
            return web.json_response({"error": "no such payload", "field": "path"}, status=404)
        resp = web.StreamResponse(status=206)
        resp.headers["Content-Range"] = f"bytes 0-999/{len(PAYLOAD)}"
        resp.content_length = 1000
        await resp.prepare(request)
        await resp.write(PAYLOAD[:300])
        await stalled.wait()  # never set: the reader's watchdog must give up
        return resp

    runner, url, _ = await _serve(handler)
    reader = RangeReader(timeout=0.5)
    try:
        reply = await reader.get_into(url, 0, 9, memoryview(bytearray(10)))
        assert reply.status == 404 and b"no such payload" in reply.body
        buf = bytearray(1000)
        with pytest.raises(RangeConnectionError, match="no byte for") as err:
            await reader.get_into(url, 0, 999, memoryview(buf))
        assert err.value.received == 300 and buf[:300] == PAYLOAD[:300]
    finally:
        stalled.set()
        await reader.close()
        await runner.cleanup()


async def test_over_tls_a_head_sent_with_its_body_in_one_write_lands_whole(tmp_path: Path) -> None:
    """The weight-server answers a chunk-sized range in one write (a plain Response), so the head and the first body
    records reach the reader together. asyncio's TLS transport fills a BufferedProtocol's buffer one TLS record at a
    time, each later record into buf[offset:]: of a bytearray that is a copy, and the head buffer was one, so those
    records' bytes were lost and stale ones counted (the cluster lane's platform run: workers refused version 0 with
    "chunk 0 sha256 mismatch" when the weight-server answered in one write)."""
    creds = generate(tmp_path / "credentials", {"weight-server": ["127.0.0.1"]})
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(creds.directory / "tls-weight-server.crt", creds.directory / "tls-weight-server.key")

    async def one_write(request: web.Request) -> web.Response:
        start, end = (int(x) for x in request.headers["Range"].removeprefix("bytes=").split("-"))
        headers = {"Content-Range": f"bytes {start}-{end}/{len(PAYLOAD)}"}
        return web.Response(status=206, body=PAYLOAD[start : end + 1], headers=headers)

    runner, url, _ = await _serve(one_write, tls=server)
    reader = RangeReader(tls=ssl.create_default_context(cadata=creds.ca().decode()), timeout=10)
    try:
        assert await _three_ranges(reader, url) == PAYLOAD
    finally:
        await reader.close()
        await runner.cleanup()
