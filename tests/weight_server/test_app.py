"""The weight-server app over real HTTP (uvicorn on a loopback port in a thread): uploads, Range reads,
auth, JSON errors, sync plans, metrics, and the NATS announcement seen by a real subscriber."""

from __future__ import annotations

import hashlib
import json
import os

import httpx
import nats
import pytest

import weight_server.app
from rlboost.nats_server import NatsServer
from rlboost.wire.events import WEIGHTS, WeightsAnnounced
from rlboost.wire.weights_io import HEADER_BASE_VERSION, HEADER_CHECKSUM, HEADER_KIND, Manifest, VersionList
from tests.weight_server.servers import TOKEN, ThreadServer
from weight_server.app import HTTP_STATUS
from weight_server.errors import ErrorKind

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def put(client: httpx.Client, version: int, data: bytes, kind: str = "full", base: int | None = None, **hdr):
    headers = {**AUTH, HEADER_KIND: kind, HEADER_CHECKSUM: f"sum{version}", **hdr}
    if base is not None:
        headers[HEADER_BASE_VERSION] = str(base)
    return client.put(f"/v1/versions/{version}", content=data, headers=headers)


def test_upload_then_read_back_with_manifest(client) -> None:
    data = os.urandom(10_000)
    resp = put(client, 0, data)
    assert resp.status_code == 200, resp.text
    m = Manifest.model_validate(resp.json())
    assert (m.version, m.kind, m.checksum, m.total_bytes) == (0, "full", "sum0", 10_000)
    assert m.sha256 == hashlib.sha256(data).hexdigest() and len(m.chunks) == 3
    assert Manifest.model_validate(client.get("/v1/versions/0/manifest").json()) == m
    assert VersionList.model_validate(client.get("/v1/versions").json()) == VersionList(latest=0, versions=[0])
    full = client.get("/v1/versions/0/payload")
    assert full.status_code == 200 and full.content == data


@pytest.mark.parametrize("cached", [True, False], ids=["page-cache-read", "threaded-read"])
def test_range_reads(client, monkeypatch, cached: bool) -> None:
    """Ranges of at most one read block are read at once: on the event loop when the page cache holds them
    (weight_server.store.read_if_cached), else in a thread; the bytes are the same either way."""
    if not cached:
        monkeypatch.setattr(weight_server.app, "read_if_cached", lambda *_: None)
    data = os.urandom(5000)
    put(client, 0, data)
    for rng, start, end in [
        ("bytes=10-19", 10, 19),
        ("bytes=4990-", 4990, 4999),
        ("bytes=-5", 4995, 4999),
        ("bytes=4000-99999", 4000, 4999),
    ]:
        r = client.get("/v1/versions/0/payload", headers={"Range": rng})
        assert r.status_code == 206, rng
        assert r.headers["content-range"] == f"bytes {start}-{end}/5000"
        assert r.content == data[start : end + 1]
    for bad in ["bytes=5000-", "bytes=20-10", "bytes=0-1,5-6", "items=0-1", "bytes=-0"]:
        r = client.get("/v1/versions/0/payload", headers={"Range": bad})
        assert r.status_code == 416, bad
        assert r.headers["content-range"] == "bytes */5000" and r.json()["field"] == "Range"


def test_upload_needs_the_bearer_token(client) -> None:
    r = client.put("/v1/versions/0", content=b"x", headers={HEADER_CHECKSUM: "c"})
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
    r = client.put("/v1/versions/0", content=b"x", headers={HEADER_CHECKSUM: "c", "Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert client.get("/v1/versions").json()["versions"] == []


def test_errors_are_json_with_the_field(client) -> None:
    r = client.get("/v1/versions/7/manifest")
    assert r.status_code == 404 and r.json()["field"] == "version"
    assert client.get("/v1/versions/7/payload").status_code == 404
    assert put(client, 1, b"d", "delta", 0).json() == {
        "error": "base_version 0 is not held; upload a full snapshot instead",
        "field": "base_version",
    }
    assert put(client, 0, b"a").status_code == 200
    r = put(client, 0, b"again")
    assert r.status_code == 409 and r.json()["field"] == "version"
    r = put(client, 1, b"d", "delta", None, **{HEADER_BASE_VERSION: "zero"})
    assert r.status_code == 422 and r.json()["field"] == HEADER_BASE_VERSION
    r = client.get("/v1/sync", params={"from": "x"})
    assert r.status_code == 422 and r.json()["field"] == "from"


def test_every_kind_of_refusal_has_its_http_status() -> None:
    assert set(HTTP_STATUS) == set(ErrorKind)


def test_sync_plan_and_retention_over_http(client, server) -> None:
    put(client, 0, b"F" * 3000)
    for v in range(1, 5):
        assert put(client, v, b"d" * 10, "delta", v - 1).status_code == 200
    # retain 3 = {2,3,4}, but their chain needs 1 and the snapshot 0
    assert client.get("/v1/versions").json()["versions"] == [0, 1, 2, 3, 4]
    assert [m["version"] for m in client.get("/v1/sync", params={"from": 2, "to": 4}).json()] == [3, 4]
    assert [m["version"] for m in client.get("/v1/sync").json()] == [0, 1, 2, 3, 4]
    put(client, 5, b"F" * 100)
    for v in (6, 7, 8):
        put(client, v, b"d", "delta", v - 1)
    # newest 3 = {6, 7, 8} chain back to the snapshot 5; the older chain is gone
    assert client.get("/v1/versions").json()["versions"] == [5, 6, 7, 8]
    assert [m["version"] for m in client.get("/v1/sync", params={"from": 2}).json()] == [5, 6, 7, 8]
    assert not (server.store.root / "versions" / "4").exists()


def test_read_token_guards_reads(tmp_path) -> None:
    with ThreadServer(tmp_path, read_token="reader") as srv, httpx.Client(base_url=srv.url) as c:
        assert c.get("/v1/versions").status_code == 401
        assert c.get("/v1/versions", headers={"Authorization": "Bearer reader"}).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes stay open


def test_metrics_count_uploads_bytes_and_ranges(client) -> None:
    put(client, 0, b"z" * 1000)
    put(client, 1, b"y" * 10, "delta", 0)
    client.get("/v1/versions/0/payload", headers={"Range": "bytes=0-99"})
    client.get("/v1/versions/1/payload")
    text = client.get("/metrics").text
    assert 'rlboost_weights_uploads_total{kind="delta"} 1.0' in text
    assert 'rlboost_weights_bytes_served_total{path="full"} 100.0' in text
    assert 'rlboost_weights_bytes_served_total{path="delta"} 10.0' in text
    assert "rlboost_weights_range_requests_total 1.0" in text
    assert "rlboost_weights_versions_held 2.0" in text
    assert "rlboost_weights_bytes_on_disk 1010.0" in text


async def test_upload_is_announced_on_nats(tmp_path, nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    sub = await nc.subscribe(WEIGHTS.subject("default", "annc"))
    try:
        with ThreadServer(tmp_path, nats_url=nats_server.url, job="annc") as srv:
            async with httpx.AsyncClient(base_url=srv.url) as c:
                r = await c.put("/v1/versions/0", content=b"w", headers={**AUTH, HEADER_CHECKSUM: "abc"})
                assert r.status_code == 200
            msg = await sub.next_msg(timeout=5)
        assert WeightsAnnounced.model_validate(json.loads(msg.data)) == WeightsAnnounced(
            version=0, checksum="abc", kind="full"
        )
    finally:
        await nc.close()


async def test_serving_continues_when_nats_dies_and_announces_after_it_returns(tmp_path, nats_server) -> None:
    with ThreadServer(tmp_path / "data", nats_url=nats_server.url, job="drop") as srv:
        nats_server.stop()  # NATS goes away after start: uploads and reads still succeed
        async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
            r = await c.put("/v1/versions/0", content=b"w", headers={**AUTH, HEADER_CHECKSUM: "abc"})
            assert r.status_code == 200
            assert (await c.get("/v1/versions/0/payload")).content == b"w"
            with NatsServer(tmp_path / "nats2", port=nats_server.port) as again:
                nc = await nats.connect(again.url)
                try:
                    sub = await nc.subscribe(WEIGHTS.subject("default", "drop"))
                    await nc.flush()
                    # the server's client reconnects on its own; announcements flow again
                    for v in range(1, 200):
                        r = await c.put(f"/v1/versions/{v}", content=b"w", headers={**AUTH, HEADER_CHECKSUM: "x"})
                        assert r.status_code == 200
                        try:
                            msg = await sub.next_msg(timeout=0.5)
                            break
                        except nats.errors.TimeoutError:
                            continue
                    else:
                        raise AssertionError("no announcement after NATS came back")
                    assert 0 <= WeightsAnnounced.model_validate_json(msg.data).version <= v  # buffered ones count too
                finally:
                    await nc.close()


async def test_snapshot_version_with_its_delta_over_http_counts_bytes_and_announces_once(tmp_path, nats_server):
    """Delta first (announced), then the snapshot as its companion (not announced again); the sync plan
    sends the delta to a worker one version behind and the snapshot to a new worker; bytes served count
    each path."""
    nc = await nats.connect(nats_server.url)
    sub = await nc.subscribe(WEIGHTS.subject("default", "comp"))
    try:
        with ThreadServer(tmp_path, nats_url=nats_server.url, job="comp") as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
                h = {**AUTH, HEADER_CHECKSUM: "s1"}
                assert (await c.put("/v1/versions/0", content=b"F" * 3000, headers=h)).status_code == 200
                delta_h = {**h, HEADER_KIND: "delta", HEADER_BASE_VERSION: "0"}
                assert (await c.put("/v1/versions/1", content=b"d" * 30, headers=delta_h)).status_code == 200
                r = await c.put("/v1/versions/1", content=b"S" * 3000, headers={**h, HEADER_KIND: "full"})
                assert r.status_code == 200, r.text
                snap = Manifest.model_validate(r.json())
                assert snap.companion and snap.payload_path == "/versions/1/full/payload"
                again = await c.put("/v1/versions/1", content=b"S", headers={**h, HEADER_KIND: "full"})
                assert (again.status_code, again.json()["field"]) == (409, "version")  # holds both kinds already
                other = {**AUTH, HEADER_CHECKSUM: "other", HEADER_KIND: "delta"}
                bad = await c.put("/v1/versions/0", content=b"d", headers=other)
                assert (bad.status_code, bad.json()["field"]) == (409, "checksum")  # must be the same state
                behind = [Manifest.model_validate(m) for m in (await c.get("/v1/sync?from=0&to=1")).json()]
                new = [Manifest.model_validate(m) for m in (await c.get("/v1/sync?to=1")).json()]
                assert [(m.kind, m.total_bytes) for m in behind] == [("delta", 30)]
                assert [(m.kind, m.companion) for m in new] == [("full", True)]
                got = await c.get("/v1" + new[0].payload_path, headers={"Range": "bytes=0-999"})
                assert got.status_code == 206 and got.content == b"S" * 1000
                assert (await c.get("/v1/versions/1/manifest", params={"kind": "full"})).json()["companion"]
                assert (await c.get("/v1/versions/0/delta/payload")).status_code == 404
                text = (await c.get("/metrics")).text
            assert 'rlboost_weights_bytes_served_total{path="full"} 1000.0' in text
            assert "rlboost_weights_bytes_on_disk 6030.0" in text
            seen = [WeightsAnnounced.model_validate_json((await sub.next_msg(timeout=5)).data) for _ in range(2)]
            assert [(e.version, e.kind) for e in seen] == [(0, "full"), (1, "delta")]
            await nc.flush()
            with pytest.raises(nats.errors.TimeoutError):  # the companion added no version: no announcement
                await sub.next_msg(timeout=0.3)
    finally:
        await nc.close()


def test_an_upload_cut_mid_body_leaves_no_version_and_can_be_redone(client, server) -> None:
    """The client dies after 10 MB of a 20 MB snapshot (a disk write is in flight: bodies are written in 4 MB
    blocks while the next is received): nothing is installed, and the full upload that follows succeeds."""
    import socket

    from tests.helpers import wait_until

    body = os.urandom(20 << 20)
    head = (
        f"PUT /v1/versions/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n{HEADER_KIND}: full\r\n"
        f"{HEADER_CHECKSUM}: sum0\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head.encode() + body[: 10 << 20])
    wait_until(lambda: not server.store.uploading(), timeout=10, what="the cut upload to be released")
    assert client.get("/v1/versions/0/manifest").status_code == 404
    r = put(client, 0, body)
    assert r.status_code == 200, r.text
    assert client.get("/v1/versions/0/payload", headers={"Range": "bytes=0-9"}).content == body[:10]


def test_healthz_fails_when_the_event_loop_was_blocked_then_recovers(tmp_path) -> None:
    import threading

    from rlboost.observability import LoopWatchdog
    from tests.helpers import wait_until

    release = threading.Event()
    srv = ThreadServer(tmp_path, watchdog=LoopWatchdog(max_lag_s=0.5, interval_s=0.05))
    with srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/healthz").status_code == 200
        srv.loop.call_soon_threadsafe(release.wait, 1.5)  # the fault: a handler that holds the loop 1.5 s
        r = c.get("/healthz")  # answered once the loop turns again: it must still tell
        assert r.status_code == 503 and "event loop blocked" in r.text
        wait_until(lambda: c.get("/healthz").status_code == 200, 5, what="healthy again")


def test_metrics_account_the_compaction_cache(tmp_path) -> None:
    from tests.weight_server.states import chain
    from tests.weight_server.test_store import _put_chain

    with ThreadServer(tmp_path) as srv:
        _put_chain(srv.store, chain(5))
        srv.store.compacted_cache_bytes = srv.store.compacted(0, 4).total_bytes  # room for exactly that one
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert c.get("/v1/compacted/1/4/manifest").status_code == 200  # evicts 0->4
            text = c.get("/metrics").text
    held = srv.store.compacted_bytes()
    assert "rlboost_weights_compacted_evictions_total 1.0" in text
    assert (
        f"rlboost_weights_compacted_bytes {float(held)}" in text and "rlboost_weights_compacted_deltas_held 1.0" in text
    )
