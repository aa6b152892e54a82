"""WeightPuller against a real weight-server on loopback (uvicorn in a thread) and the real WeightClient:
deltas applied in place and verified, compacted plans, and bad deltas that are never applied (a
corrupt payload, a wrong base) with the fallback to the full snapshot."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import REGISTRY

import rlboost.delta as rd
from rlboost.delta.format import parse
from rlboost.weights.checksum import delta_state_checksum
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_to_bytes
from rollout_worker.weights import WeightPuller, WeightsError
from tests.weight_server.servers import TOKEN, ThreadServer
from tests.weight_server.states import chain, checksum, delta, step


@pytest.fixture
def server(tmp_path):
    with ThreadServer(tmp_path / "data", chunk_bytes=16 << 10) as srv:
        yield srv


async def _upload(wc: WeightClient, states, v: int, kind: str = "delta", payload: bytes | None = None, sum_: str = ""):
    if kind == "full":
        await wc.upload(v, payload or state_to_bytes(states[v]), kind="full", checksum=sum_ or checksum(states[v]))
    else:
        data = payload if payload is not None else delta(states, v - 1, v)
        await wc.upload(v, data, kind="delta", checksum=sum_ or checksum(states[v]), base_version=v - 1)


def _bits(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.view(torch.int16).clone() for k, t in state.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_deltas_apply_in_place_and_match_the_published_checksum(server) -> None:
    states = chain(5)
    async with WeightClient(server.url, token=TOKEN, streams=3) as wc:
        await _upload(wc, states, 0, "full")
        puller = WeightPuller(wc)
        first = await puller.pull(0)
        assert first.paths == {"full": first.nbytes} and first.checksum == checksum(states[0])
        tensors = {k: t for k, t in first.state.items()}
        applied = _sample("rlboost_worker_weight_apply_seconds_count", path="delta")
        for v in (1, 2):
            await _upload(wc, states, v)
            pulled = await puller.pull(v)
            assert pulled.checksum == checksum(states[v]) and set(pulled.paths) == {"delta"} and not pulled.fallback
            assert all(pulled.state[k] is tensors[k] for k in tensors)  # applied in place, no second copy
        assert pulled.nbytes < first.nbytes / 20  # ~1% of elements changed
        assert _sample("rlboost_worker_weight_apply_seconds_count", path="delta") == applied + 2
        # Two versions behind: one compacted delta instead of the chain.
        for v in (3, 4):
            await _upload(wc, states, v)
        pulled = await puller.pull(4)
        assert set(pulled.paths) == {"compacted"} and pulled.checksum == checksum(states[4])
        assert _sample("rlboost_worker_weight_version_pull_bytes", path="compacted") == pulled.nbytes


async def test_wrong_base_delta_is_never_applied_and_the_full_snapshot_is_fetched(server) -> None:
    """The worker's held weights drifted from version 1 (the delta's base): the delta is refused before any
    write, and the worker rebuilds version 2 from the full snapshot."""
    states = chain(3)
    async with WeightClient(server.url, token=TOKEN) as wc:
        await _upload(wc, states, 0, "full")
        await _upload(wc, states, 1)
        puller = WeightPuller(wc)
        await puller.pull(1)
        held = puller.held.state
        held["norm.bias"][3] = torch.tensor(7.0, dtype=torch.bfloat16)  # not the published version 1 any more
        before = _bits(held)
        rejected = _sample("rlboost_worker_weight_deltas_rejected_total")
        fallbacks = _sample("rlboost_worker_weight_full_fallbacks_total")
        await _upload(wc, states, 2)
        pulled = await puller.pull(2)
        assert _same(_bits(held), before)  # the refused delta wrote nothing
        assert pulled.fallback and "full" in pulled.paths and pulled.checksum == checksum(states[2])
        assert _sample("rlboost_worker_weight_deltas_rejected_total") == rejected + 1
        assert _sample("rlboost_worker_weight_full_fallbacks_total") == fallbacks + 1


async def test_corrupt_delta_is_refused_without_writing_and_the_pull_fails_clearly(server) -> None:
    """A delta corrupted before upload (its sha256 matches what the server stores, so only the codec can
    tell): every path to version 2 contains it, so the pull fails with WeightsError and the weights held
    are exactly version 1's."""
    states = chain(3)
    async with WeightClient(server.url, token=TOKEN) as wc:
        await _upload(wc, states, 0, "full")
        await _upload(wc, states, 1)
        puller = WeightPuller(wc)
        await puller.pull(1)
        held = puller.held.state
        before = _bits(held)
        bad = bytearray(delta(states, 1, 2))
        bad[-10] ^= 0xFF  # a flipped byte in the last tensor's payload
        await _upload(wc, states, 2, payload=bytes(bad))
        with pytest.raises(WeightsError, match="weight version 2"):
            await puller.pull(2)
        assert _same(_bits(held), before) and checksum(held) == checksum(states[1])


async def test_checksum_mismatch_after_a_clean_apply_refetches_then_fails(server) -> None:
    """The manifest's checksum disagrees with what the delta produces: refetched once, then WeightsError."""
    states = chain(3)
    async with WeightClient(server.url, token=TOKEN) as wc:
        await _upload(wc, states, 0, "full")
        await _upload(wc, states, 1, sum_="0" * 64)
        puller = WeightPuller(wc)
        await puller.pull(0)
        mismatches = _sample("rlboost_worker_weight_checksum_mismatches_total")
        with pytest.raises(WeightsError, match="after a full refetch"):
            await puller.pull(1)
        assert _sample("rlboost_worker_weight_checksum_mismatches_total") == mismatches + 2
        assert puller.held is None  # the next pull starts from a full snapshot


async def test_clean_delta_whose_table_disagrees_with_the_manifest_falls_back_to_the_snapshot(server) -> None:
    """The delta is self-consistent (it applies and verifies: every tensor hashes to its table's target) but
    produces another state than the version's manifest checksum names: the checksum taken from its table is
    compared with the manifest, the delta's result is refused, and the full snapshot (the version's companion,
    same checksum) is fetched and verified instead."""
    states = chain(2)
    other = step(states[0], 77)  # a valid target, just not version 1
    async with WeightClient(server.url, token=TOKEN) as wc:
        await _upload(wc, states, 0, "full")
        wrong = rd.encode(states[0], other, base_version=0, version=1)
        assert delta_state_checksum(parse(wrong)) == checksum(other) != checksum(states[1])
        await _upload(wc, states, 1, payload=wrong)  # manifest checksum: version 1's
        await _upload(wc, states, 1, "full")  # the companion snapshot
        puller = WeightPuller(wc)
        await puller.pull(0)
        mismatches = _sample("rlboost_worker_weight_checksum_mismatches_total")
        pulled = await puller.pull(1)
        assert pulled.fallback and "full" in pulled.paths and pulled.checksum == checksum(states[1])
        assert _same(_bits(pulled.state), _bits(states[1]))
        assert _sample("rlboost_worker_weight_checksum_mismatches_total") == mismatches + 1
