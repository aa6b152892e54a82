"""The weight-server's source directory routes (peer fan-out) over real HTTP: register, ask, leave, bad input."""

from __future__ import annotations

import httpx

from tests.weight_server.servers import TOKEN, ThreadServer

AUTH = {"Authorization": f"Bearer {TOKEN}"}
PATH = "/versions/0/payload"


def register(client, worker: str, **body) -> int:
    return client.put(f"/v1/peers/{worker}", json={"url": f"http://{worker}:1", **body}, headers=AUTH).status_code


def test_a_region_relays_once_and_the_rest_pull_from_peers(client) -> None:
    for worker, region in [("a0", "a"), ("b0", "b"), ("a1", "a")]:
        assert register(client, worker, zone=f"{region}1", region=region) == 204
    answers = {
        w: client.post("/v1/sources", json={"worker": w, "path": PATH}, headers=AUTH).json() for w in ("a0", "b0", "a1")
    }
    assert answers["a0"]["relay"] and answers["b0"]["relay"] and not answers["a1"]["relay"]
    assert [s["worker"] for s in answers["a1"]["sources"]] == ["a0", ""]
    assert client.delete("/v1/peers/a0", headers=AUTH).status_code == 204
    again = client.post("/v1/sources", json={"worker": "a1", "path": PATH}, headers=AUTH).json()
    assert again["relay"]  # the relay left: the next puller of its region takes its place
    assert "rlboost_weights_peers 2.0" in client.get("/metrics").text


def test_a_peer_reported_stalled_is_not_offered_until_it_heartbeats(client) -> None:
    for worker in ("a0", "a1", "a2"):
        assert register(client, worker, zone="a1", region="a") == 204
    client.post("/v1/sources", json={"worker": "a0", "path": PATH}, headers=AUTH)
    assert client.post("/v1/stalled", json={"worker": "a1", "peer": "a0"}, headers=AUTH).status_code == 204
    again = client.post("/v1/sources", json={"worker": "a2", "path": PATH}, headers=AUTH).json()
    assert again["relay"] and [s["worker"] for s in again["sources"]] == [""]  # a0, ahead of it, is skipped
    assert "rlboost_weights_peer_stalled_reports_total 1.0" in client.get("/metrics").text
    resp = client.post("/v1/stalled", json={"worker": "a1", "peer": "bad id"}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "peer"


def test_bad_registrations_are_refused_naming_the_field(client) -> None:
    resp = client.put("/v1/peers/w", json={"url": "file:///etc"}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "url"
    resp = client.post("/v1/sources", json={"worker": "w", "path": "/etc/passwd"}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "path"
    resp = client.put("/v1/peers/bad%20id", json={"url": "http://x:1"}, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["field"] == "worker"


def test_the_directory_needs_the_read_token_when_reads_do(tmp_path) -> None:
    with ThreadServer(tmp_path / "data", read_token="reader") as server:
        resp = httpx.put(f"{server.url}/v1/peers/w", json={"url": "http://w:1"})
        assert resp.status_code == 401 and resp.json()["field"] == "Authorization"
        ok = httpx.put(
            f"{server.url}/v1/peers/w", json={"url": "http://w:1"}, headers={"Authorization": "Bearer reader"}
        )
        assert ok.status_code == 204
