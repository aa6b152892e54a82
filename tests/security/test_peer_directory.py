"""The audit's peer-directory squatting (issue 31 item 3), against a real weight-server process started with the
job's credentials: the attacker holds the shared worker token (what every worker pod has) and even its own
worker's identity proof, but not another worker's.

Audit: anyone with the worker token registered peers under any worker's name (spot-0, reserved-0) pointing at a
dead address, deleted another worker's entry, and added thousands of entries (2,033 were held); /v1/sources then
listed the attacker's peers first. Now each entry is bound to the worker that proves its id (X-Rlboost-Identity,
the same proof it registers with the manager with), the directory is bounded and entries expire.
"""

from __future__ import annotations

import httpx
import pytest

from rlboost.auth.credentials import JobCredentials
from rlboost.weights.peers import PeerDirectory
from rlboost.wire.peers_io import HEADER_IDENTITY
from tests.rollout_manager.client import identity_proof
from tests.security.conftest import Service
from tests.weight_server.servers import TOKEN, ThreadServer

PATH = "/versions/0/payload"
DEAD = "http://10.255.255.1:9"  # an address that answers nothing (never contacted by the test)


def _client(service: Service) -> httpx.Client:
    token = service.creds.token("worker")
    auth = {"Authorization": f"Bearer {token}"}
    return httpx.Client(base_url=f"http://{service.target}", headers=auth, timeout=60)  # a loaded machine


def _as(creds: JobCredentials, worker: str, pool: int | None = None) -> dict[str, str]:
    """The identity header of worker `worker` (a real worker's proof, as `rlboost local` mints it)."""
    return {HEADER_IDENTITY: identity_proof(creds, worker) if pool is None else identity_proof(creds, worker, pool)}


def _register(c: httpx.Client, worker: str, headers: dict[str, str], url: str = DEAD) -> httpx.Response:
    return c.put(f"/v1/peers/{worker}", json={"url": url, "holds": [PATH]}, headers=headers)


def _sources(c: httpx.Client, worker: str, headers: dict[str, str]) -> httpx.Response:
    return c.post("/v1/sources", json={"worker": worker, "path": PATH}, headers=headers)


def _refused(metrics: str, reason: str) -> float:
    line = next(
        (
            ln
            for ln in metrics.splitlines()
            if ln.startswith(f'rlboost_weights_peer_refused_total{{reason="{reason}"}}')
        ),
        "",
    )
    return float(line.split()[-1]) if line else 0.0


def test_registering_under_another_workers_name_is_refused(weight_server: Service) -> None:
    creds = weight_server.creds
    with _client(weight_server) as c:
        for victim in ("spot-0", "reserved-0"):
            for headers in ({}, {HEADER_IDENTITY: "rlboost-local-v1." + "0" * 64}, _as(creds, "spot-1")):
                r = _register(c, victim, headers)
                assert r.status_code == 401 and r.json()["field"] == HEADER_IDENTITY, r.text
        assert _register(c, "spot-1", _as(creds, "spot-1"), "http://127.0.0.1:1").status_code == 204  # itself: yes
        # the real spot-0 asks where to pull: the attacker's dead peers are nowhere, only spot-1 (who holds it)
        found = _sources(c, "spot-0", _as(creds, "spot-0"))
        assert found.status_code == 200 and [s["worker"] for s in found.json()["sources"]] == [""], found.text
        assert _register(c, "spot-0", _as(creds, "spot-0"), "http://127.0.0.1:2").status_code == 204
        found = _sources(c, "spot-0", _as(creds, "spot-0"))
        assert [s["worker"] for s in found.json()["sources"]] == ["spot-1", ""]
        assert _refused(c.get("/metrics").text, "unauthenticated") == 6.0


def test_deleting_or_asking_as_another_worker_is_refused(weight_server: Service) -> None:
    creds = weight_server.creds
    with _client(weight_server) as c:
        assert _register(c, "spot-0", _as(creds, "spot-0"), "http://127.0.0.1:2").status_code == 204
        for headers in ({}, _as(creds, "spot-1")):
            assert c.delete("/v1/peers/spot-0", headers=headers).status_code == 401
            assert _sources(c, "spot-0", headers).status_code == 401  # no place in another worker's chain
        assert "rlboost_weights_peers 1.0" in c.get("/metrics").text  # spot-0's entry is still there
        assert c.delete("/v1/peers/spot-0", headers=_as(creds, "spot-0")).status_code == 204  # itself: yes
        assert "rlboost_weights_peers 0.0" in c.get("/metrics").text


def test_reporting_a_peer_stalled_as_another_worker_is_refused(weight_server: Service) -> None:
    """A stalled-peer report hides a peer until its next heartbeat: only a registered worker, as itself, may make
    one (issue 34)."""
    creds = weight_server.creds
    with _client(weight_server) as c:
        for w in ("spot-0", "spot-1"):
            assert _register(c, w, _as(creds, w), f"http://127.0.0.1:{w[-1]}").status_code == 204
        report = {"worker": "spot-1", "peer": "spot-0"}
        for headers in ({}, _as(creds, "spot-0")):
            assert c.post("/v1/stalled", json=report, headers=headers).status_code == 401
        assert "rlboost_weights_peer_stalled_reports_total 0.0" in c.get("/metrics").text
        assert c.post("/v1/stalled", json=report, headers=_as(creds, "spot-1")).status_code == 204  # itself: yes
        assert "rlboost_weights_peer_stalled_reports_total 1.0" in c.get("/metrics").text


def test_thousands_of_entries_cannot_be_added_with_the_worker_token(weight_server: Service) -> None:
    """The audit held 2,033 entries; without each worker's proof none is held."""
    creds = weight_server.creds
    with _client(weight_server) as c:
        codes = {_register(c, f"squat-{i}", _as(creds, "spot-1")).status_code for i in range(2033)}
        assert codes == {401} and "rlboost_weights_peers 0.0" in c.get("/metrics").text


def test_the_directory_is_bounded_and_its_entries_expire(tmp_path) -> None:
    """Even real workers cannot hold more than the bound: a new one past it is refused (413, naming the bound) until
    one leaves or stops heartbeating (its entry expires after ttl_s)."""
    peers = PeerDirectory(ttl_s=30.0, max_entries=3)
    with ThreadServer(tmp_path / "data", peers=peers) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for w in ("w0", "w1", "w2"):
            assert _register(c, w, auth).status_code == 204
        full = _register(c, "w3", auth)
        assert full.status_code == 413 and "holds 3 workers, its bound" in full.json()["error"]
        assert _register(c, "w0", auth).status_code == 204  # a heartbeat of one held is not a new entry
        for peer in peers.peers.values():  # 31 s pass without a heartbeat from w1, w2 (the clock, not a sleep)
            peer.seen -= 31.0 if peer.worker != "w0" else 0.0
        assert _register(c, "w3", auth).status_code == 204 and sorted(peers.peers) == ["w0", "w3"]


@pytest.mark.parametrize("pool", [0, 1])
def test_a_worker_of_either_pool_is_recognised_by_its_own_proof(weight_server: Service, pool: int) -> None:
    from rlboost.rollout.v1 import rollout_pb2 as pb

    kind = [pb.POOL_RESERVED, pb.POOL_SPOT][pool]
    with _client(weight_server) as c:
        assert _register(c, "w-9", _as(weight_server.creds, "w-9", kind)).status_code == 204
