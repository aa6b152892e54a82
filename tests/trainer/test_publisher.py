"""bf16 publication against a real weight-server process: the uploaded payload is the bf16 cast, bit for bit."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlboost.weights.checksum import state_checksum
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_from_bytes
from tests.trainer.peers import TOKEN, WeightServerProcess
from trainer.publisher import WeightPublisher, publish_state


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    w = torch.randn(8, 16, generator=g)
    w[0, :4] = torch.tensor([float("nan"), -0.0, 1e-40, float("inf")])  # specials survive as bit patterns
    return {"b.weight": w, "a.bias": torch.randn(16, generator=g), "steps": torch.arange(3)}


def test_publish_state_casts_floats_to_bf16_and_keeps_integers():
    out = publish_state(_state())
    assert out["b.weight"].dtype == torch.bfloat16 and out["a.bias"].dtype == torch.bfloat16
    assert out["steps"].dtype == torch.int64
    assert torch.equal(out["b.weight"].view(torch.int16), _state()["b.weight"].to(torch.bfloat16).view(torch.int16))


async def test_uploaded_payload_checksum_equals_checksum_of_bf16_cast(tmp_path):
    state = _state()
    want = state_checksum({k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state.items()})
    with WeightServerProcess(tmp_path / "ws") as ws:
        async with WeightClient(ws.url, token=TOKEN) as client:
            pub = WeightPublisher(client)
            first = await pub.publish(0, state, skip_if_present=True)
            assert first.uploaded and first.checksum == want
            manifest = await client.manifest(0)
            assert manifest.checksum == want and manifest.kind == "full"
            pulled = state_from_bytes(await client.pull(0))
            assert state_checksum(pulled) == want
            assert set(pulled) == set(state)

            # A restarted trainer finds version 0 already there and does not upload it again.
            again = await WeightPublisher(client).publish(0, state, skip_if_present=True)
            assert not again.uploaded and again.checksum == want

            moved = {k: (v + 1 if v.is_floating_point() else v) for k, v in state.items()}
            second = await pub.publish(1, moved)
            assert second.checksum != want
            assert (await client.versions()).versions == [0, 1]
            assert state_checksum(state_from_bytes(await client.pull(1))) == second.checksum


class CountingClient(WeightClient):
    """A real client that counts its upload attempts (to start the server again only once one has failed)."""

    uploads = 0

    async def upload(self, *args: object, **kwargs: object):  # type: ignore[override]
        self.uploads += 1
        return await super().upload(*args, **kwargs)


async def _until(condition, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_upload_retries_while_the_weight_server_restarts_and_it_keeps_its_versions(tmp_path):
    """The weight-server SIGKILLed between two versions: the next upload is retried with back-off until the server
    is back; the restarted server reloads version 0 from its disk and serves it unchanged."""
    state = _state()
    moved = {k: (v + 1 if v.is_floating_point() else v) for k, v in state.items()}
    with WeightServerProcess(tmp_path / "ws") as ws:
        async with CountingClient(ws.url, token=TOKEN) as client:
            pub = WeightPublisher(client)
            first = await pub.publish(0, state)
            ws.kill()
            upload = asyncio.create_task(pub.publish(1, moved))
            await _until(lambda: client.uploads >= 2 or upload.done())  # refused once, and trying again
            assert not upload.done()
            ws.__enter__()  # the same port and data directory
            second = await asyncio.wait_for(upload, 60)
            assert (await client.versions()).versions == [0, 1]
            assert (await client.manifest(0)).checksum == first.checksum
            assert state_checksum(state_from_bytes(await client.pull(1))) == second.checksum


# ---- delta mode ---------------------------------------------------------------------------------
def _rl_step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """fp32 master weights moved by Adam-sized steps: only a few bf16 elements change."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v + torch.randn(v.shape, generator=g) * 3e-5 if v.is_floating_point() else v) for k, v in state.items()}


def _big_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(256, 256, generator=g), "b": torch.randn(256, generator=g), "n": torch.arange(4)}


async def _replay(client: WeightClient, upto: int) -> dict[str, torch.Tensor]:
    """Rebuild version `upto` from the server's own plan with the real codec (what a worker does)."""
    import rlboost.delta as rd

    state: dict[str, torch.Tensor] = {}
    for m in await client.sync_plan(None, upto, compact=False):
        payload = await client.pull(m)
        state = state_from_bytes(payload) if m.kind == "full" else rd.apply(state, payload)
    return state


async def test_delta_mode_uploads_deltas_between_periodic_snapshots(tmp_path):
    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    with ThreadServer(tmp_path / "ws") as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client:
            pub = WeightPublisher(client, mode="delta", full_every=3)
            state, kinds = _big_state(), []
            for v in range(5):
                out = await pub.publish(v, state)
                kinds.append((out.kind, out.base_version))
                manifest = await client.manifest(v, out.kind)
                assert (manifest.kind, manifest.base_version, manifest.checksum) == (
                    out.kind,
                    out.base_version,
                    out.checksum,
                )
                assert state_checksum(await _replay(client, v)) == out.checksum  # bit-exact through the chain
                if out.kind == "delta":
                    assert out.nbytes < 0.2 * (256 * 256 * 2)
                state = _rl_step(state, v)
            assert kinds == [("full", None), ("delta", 0), ("delta", 1), ("full", None), ("delta", 3)]


async def test_full_mode_and_a_lost_base_upload_snapshots(tmp_path):
    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    state = _big_state()
    with ThreadServer(tmp_path / "a") as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client:
            full = WeightPublisher(client, mode="full")
            assert [(await full.publish(v, _rl_step(state, v))).kind for v in range(2)] == ["full", "full"]
    # The trainer's last published version is 0, but a fresh weight-server does not hold it: the delta
    # for version 1 is refused (base_version) and re-sent as a snapshot.
    with ThreadServer(tmp_path / "b") as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client:
            pub = WeightPublisher(client)
            pub.last_state = publish_state(state)
            pub.last = type(full.last)(0, "x", "full", 0, 0.0, True)
            out = await pub.publish(1, _rl_step(state, 1))
            assert out.kind == "full" and (await client.manifest(1)).kind == "full"


async def test_overlap_returns_before_the_upload_and_flush_waits_for_it(tmp_path):
    """With overlap the next version is encoded while the previous one uploads; flush surfaces the upload."""
    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    with ThreadServer(tmp_path / "ws") as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client, WeightPublisher(client, overlap=True) as pub:
            state = _big_state()
            for v in range(3):
                out = await pub.publish(v, state)
                state = _rl_step(state, v)
            await pub.flush()
            assert out.upload_seconds > 0 and out.kind == "delta"
            assert (await client.versions()).versions == [0, 1, 2]
            assert state_checksum(await _replay(client, 2)) == out.checksum
        async with WeightClient(ws.url, token="wrong") as bad:
            pub = WeightPublisher(bad, overlap=True)
            await pub.publish(3, state)  # returns: the refusal surfaces on flush
            with pytest.raises(Exception, match="Bearer"):
                await pub.flush()


async def test_snapshot_version_also_uploads_its_delta_and_workers_pull_the_cheaper_one(tmp_path):
    """Real publisher -> real weight-server (uvicorn on loopback) -> the rollout-worker's real WeightPuller:
    at the periodic snapshot version 3 the delta 2->3 goes up first, then the snapshot beside it; a worker at 2
    pulls the delta (bytes by path), a new worker the snapshot, both bit-exact to the published checksum."""
    from rollout_worker.weights import WeightPuller
    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    with ThreadServer(tmp_path / "ws", retain=2) as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client:
            pub = WeightPublisher(client, mode="delta", full_every=3)
            old_worker = WeightPuller(client)
            state, outs = _big_state(), []
            for v in range(4):
                outs.append(await pub.publish(v, state))
                if v == 2:
                    assert (await old_worker.pull(2)).checksum == outs[2].checksum
                state = _rl_step(state, v)
            snap = outs[3]
            assert (snap.kind, snap.base_version, snap.companion_base) == ("full", None, 2)
            full, delta = await client.manifest(3, "full"), await client.manifest(3, "delta")
            assert (delta.companion, delta.base_version, full.companion) == (False, 2, True)
            assert full.checksum == delta.checksum == snap.checksum
            assert snap.nbytes == full.total_bytes + delta.total_bytes and delta.total_bytes < full.total_bytes / 5
            # Retention (2 versions): the newest two are 2 and 3, and 2 still chains back to the snapshot 0.
            assert (await client.versions()).versions == [0, 1, 2, 3]

            before = _served(ws.url, "delta")
            pulled = await old_worker.pull(3)
            assert pulled.checksum == snap.checksum and pulled.paths == {"delta": delta.total_bytes}
            assert _served(ws.url, "delta") == before + delta.total_bytes  # the companion path is counted
            before = _served(ws.url, "full")
            fresh = await WeightPuller(client).pull(3)
            assert fresh.checksum == snap.checksum and fresh.paths == {"full": full.total_bytes}
            assert _served(ws.url, "full") == before + full.total_bytes
            assert state_checksum(await _replay(client, 3)) == snap.checksum
            await pub.publish(4, state)
            assert (await client.versions()).versions == [3, 4]  # 3 holds a snapshot: the older chain went


def _served(url: str, path: str) -> float:
    """rlboost_weights_bytes_served_total{path=...} scraped from the weight-server's /metrics."""
    import httpx

    prefix = f'rlboost_weights_bytes_served_total{{path="{path}"}} '
    lines = [ln for ln in httpx.get(url + "/metrics", timeout=10).text.splitlines() if ln.startswith(prefix)]
    return float(lines[0][len(prefix) :]) if lines else 0.0


# ---- no wasted work per step (issue 34, "Step time against TRL") --------------------------------
class ListingClient(WeightClient):
    """A real client that counts the version listings it asks the weight-server for."""

    listings = 0

    async def versions(self):  # type: ignore[override]
        self.listings += 1
        return await super().versions()


def _dense_step(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A high learning rate's step: nearly every bf16 element changes, so every delta is larger than a snapshot."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v + torch.randn(v.shape, generator=g) * 1e-2 if v.is_floating_point() else v) for k, v in state.items()}


async def test_a_dense_update_is_never_encoded_as_a_delta_only_to_be_dropped(tmp_path, monkeypatch):
    """Through the real publisher and weight-server: dense updates publish snapshots without one delta encode
    (the periodic snapshot's companion included), byte for byte the snapshot of the state; once the updates are
    sparse again, deltas are encoded and sent."""
    from prometheus_client import REGISTRY

    import trainer.publisher as publisher
    from rlboost.weights.safetensors_io import state_to_bytes
    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    def choices(outcome: str) -> float:
        return REGISTRY.get_sample_value("rlboost_trainer_delta_choices_total", {"outcome": outcome}) or 0.0

    before = {o: choices(o) for o in ("sent", "too_large", "not_encoded")}
    encodes = []
    real = publisher.encode_delta
    monkeypatch.setattr(publisher, "encode_delta", lambda *a: encodes.append(a[3]) or real(*a))
    with ThreadServer(tmp_path / "ws") as ws:
        async with WeightClient(ws.url, token=WS_TOKEN) as client:
            pub = WeightPublisher(client, mode="delta", full_every=3)
            state, kinds = _big_state(), []
            for v in range(6):
                kinds.append((await pub.publish(v, state)).kind)
                assert await client.pull(v) == state_to_bytes(publish_state(state))
                state = _dense_step(state, v)
            assert kinds == ["full"] * 6 and encodes == [] and pub.deltas_not_encoded == 5  # v1-5, v3's companion
            for v in range(6, 9):  # 6: a periodic snapshot, its companion still dense (from 5); 7, 8: sparse
                out = await pub.publish(v, state)
                state = _rl_step(state, v)
            assert (out.kind, encodes, pub.deltas_not_encoded) == ("delta", [7, 8], 6)
            assert {o: choices(o) - n for o, n in before.items()} == {"sent": 2, "too_large": 0, "not_encoded": 6}
            assert state_checksum(await _replay(client, 8)) == out.checksum


async def test_steps_do_not_ask_the_weight_server_for_its_versions(tmp_path):
    """The version list is asked once, then only after an upload error (here: another writer took version 3)."""
    from prometheus_client import REGISTRY

    from tests.weight_server.servers import TOKEN as WS_TOKEN
    from tests.weight_server.servers import ThreadServer

    listed = REGISTRY.get_sample_value("rlboost_trainer_version_listings_total") or 0.0
    with ThreadServer(tmp_path / "ws") as ws:
        async with ListingClient(ws.url, token=WS_TOKEN) as client:
            pub, state = WeightPublisher(client, mode="full"), _big_state()
            for v in range(3):
                assert (await pub.publish(v, state, skip_if_present=True)).uploaded
                state = _rl_step(state, v)
            assert client.listings == 1 == REGISTRY.get_sample_value("rlboost_trainer_version_listings_total") - listed
            await WeightPublisher(client, mode="full").publish(3, state)
            with pytest.raises(Exception, match="409|exists"):
                await pub.publish(3, _rl_step(state, 3), skip_if_present=True)
            assert client.listings == 1
            assert not (await pub.publish(3, state, skip_if_present=True)).uploaded  # asked again: it is held
            assert client.listings == 2
            assert (await pub.publish(4, state, skip_if_present=True)).uploaded and client.listings == 2
