"""The audit's HTTP probes against a real weight-server process started with the job's credentials: anonymous
reads of versions, manifests, payloads, sync plans, compacted deltas and assets are refused (401, naming the
token needed) and cost the server no disk; a worker's token cannot upload (403); /healthz and /metrics stay open
for probes and Prometheus.

Audit: weights were downloaded with no credentials; 78 anonymous requests for compacted deltas grew the
weight-server's disk from 17 MB to 191 MB.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlboost.auth.credentials import JobCredentials
from rlboost.weights.client import WeightClient, WeightServerError
from rlboost.weights.safetensors_io import state_to_bytes
from tests.security.conftest import Service
from tests.weight_server.states import chain, checksum, delta

VERSIONS = 4  # a snapshot and three deltas: 0 -> 3 is a chain a compacted delta would be built for

READS = [
    "/v1/versions",
    "/v1/versions/0/manifest",
    "/v1/versions/0/payload",
    "/v1/versions/1/delta/payload",
    "/v1/sync?from=0&to=3",
    "/v1/sync?to=3",
    "/v1/compacted/0/3/manifest",
    "/v1/compacted/0/3/payload",
    "/v1/assets",
    "/v1/assets/config.json",
]


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def publish(url: str, creds: JobCredentials) -> None:
    """What the trainer does: the model's config, a snapshot and a chain of real deltas, with its token."""
    states = chain(VERSIONS)
    async with WeightClient(url, token=creds.token("trainer"), ca=creds.ca()) as trainer:
        await trainer.upload_asset("config.json", b"{}")
        await trainer.upload(0, state_to_bytes(states[0]), "full", checksum(states[0]))
        for v in range(1, VERSIONS):
            await trainer.upload(v, delta(states, v - 1, v), "delta", checksum(states[v]), base_version=v - 1)


@pytest.fixture
async def published(weight_server: Service) -> Service:
    await publish(f"http://{weight_server.target}", weight_server.creds)
    return weight_server


async def test_anonymous_reads_are_refused_and_build_nothing(published: Service, tmp_path: Path):
    data = tmp_path / "weights"
    before = disk_bytes(data)
    async with httpx.AsyncClient(base_url=f"http://{published.target}", timeout=10) as anonymous:
        for _ in range(3):  # the audit sent 78; each is refused before any work
            for path in READS:
                for headers in ({}, {"Authorization": "Bearer guessed"}):
                    r = await anonymous.get(path, headers=headers)
                    assert r.status_code == 401, (path, r.text)
                    assert r.json()["field"] == "Authorization" and "token-worker" in r.json()["error"]
    assert disk_bytes(data) == before and disk_bytes(data / "compacted") == 0


async def test_each_role_reads_and_a_compacted_delta_is_built_for_one_of_them(published: Service, tmp_path: Path):
    """The probe above is meaningful: the same request with a worker's token does build the compacted delta."""
    for role in ("worker", "trainer", "observer"):
        async with WeightClient(f"http://{published.target}", token=published.creds.token(role)) as client:
            assert (await client.versions()).latest == VERSIONS - 1
            assert [a.name for a in (await client.assets()).assets] == ["config.json"]
    async with WeightClient(f"http://{published.target}", token=published.creds.token("worker")) as worker:
        compacted = await worker.compacted(0, VERSIONS - 1)
        assert len(await worker.pull(compacted)) == compacted.total_bytes
    assert disk_bytes(tmp_path / "weights" / "compacted") > 0


@pytest.mark.parametrize("role", ["worker", "observer"])
async def test_a_reading_role_cannot_upload(published: Service, role: str):
    async with WeightClient(f"http://{published.target}", token=published.creds.token(role)) as client:
        with pytest.raises(WeightServerError) as version:
            await client.upload(VERSIONS, b"forged", "full", "c")
        with pytest.raises(WeightServerError) as asset:
            await client.upload_asset("tokenizer.json", b"forged")
        held = await client.versions()
    for err in (version.value, asset.value):
        assert (err.status, err.field) == (403, "Authorization") and "trainer token" in err.message
    assert held.latest == VERSIONS - 1


async def test_health_and_metrics_stay_open_for_probes_and_prometheus(weight_server: Service):
    async with httpx.AsyncClient(base_url=f"http://{weight_server.target}", timeout=10) as anonymous:
        assert (await anonymous.get("/healthz")).status_code == 200
        assert "rlboost_weights" in (await anonymous.get("/metrics")).text


async def test_with_tls_it_serves_https_to_clients_trusting_the_job_ca(tls_creds: JobCredentials, tmp_path: Path):
    from rlboost.nats_server import free_port
    from tests.security.conftest import _serve

    services = _serve("weight_server", tls_creds, free_port(), "--data-dir", str(tmp_path / "weights"), "--no-nats")
    server = next(services)
    try:
        url = f"https://{server.target}"
        await publish(url, tls_creds)
        # retries=1: a wrong chunk is not hidden by a luckier second read
        async with WeightClient(url, token=tls_creds.token("worker"), ca=tls_creds.ca(), retries=1) as worker:
            assert (await worker.versions()).latest == VERSIONS - 1
            # the payloads' bytes too, through the ranged reader over TLS: a chunk-sized range is answered in one
            # write, its head and body arriving together (which once lost the body's first TLS records)
            states = chain(VERSIONS)
            assert await worker.pull(0) == state_to_bytes(states[0])
            for v in range(1, VERSIONS):
                assert await worker.pull(v) == delta(states, v - 1, v)
        async with WeightClient(url, token=tls_creds.token("worker")) as untrusting:  # no job CA: no connection
            with pytest.raises(WeightServerError, match="cannot reach"):
                await untrusting.versions()
    finally:
        services.close()
