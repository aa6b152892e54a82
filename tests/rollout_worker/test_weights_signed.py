"""Authentic weights against a real weight-server process: the trainer's publisher signs each version with the
job's key, the worker's puller (the real WeightClient with the job's public key) applies what verifies and refuses,
with nothing applied, what was tampered with on the weight-server's disk (restarted so it serves the edit)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import torch
from prometheus_client import REGISTRY

from rlboost.auth.credentials import generate
from rlboost.weights.client import WeightClient
from rlboost.weights.signing import (
    ManifestSigner,
    ManifestVerifier,
    WeightsRejectedError,
    canonical_manifest,
    describe_payload,
)
from rlboost.wire.weights_io import Manifest
from rollout_worker.weights import WeightPuller, WeightsError
from tests.trainer.peers import TOKEN, WeightServerProcess
from tests.weight_server.states import chain, checksum
from trainer.publisher import WeightPublisher

CHUNK = 16 << 10  # several chunks per payload


@pytest.fixture
def creds(tmp_path):
    return generate(tmp_path / "credentials")


async def _publish(url: str, creds, states) -> None:
    async with WeightClient(url, token=TOKEN) as wc:
        publisher = WeightPublisher(wc, signer=ManifestSigner(creds.signing_key(), CHUNK))
        for v, state in enumerate(states):
            await publisher.publish(v, state)


def _bits(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.view(torch.int16).clone() for k, t in state.items()}


def _rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_worker_weight_rejected_total", {"reason": reason}) or 0.0


async def test_signed_versions_apply_and_plans_hold_no_compacted_delta(tmp_path, creds) -> None:
    states = chain(4)
    with WeightServerProcess(tmp_path / "ws") as ws:
        await _publish(ws.url, creds, states)
        async with WeightClient(ws.url, verifier=ManifestVerifier(creds.verify_key())) as wc:
            m = await wc.manifest(3)
            assert m.signature and m.chunk_bytes == CHUNK and m.kind == "delta"
            puller = WeightPuller(wc)
            assert (await puller.pull(0)).checksum == checksum(states[0])
            pulled = await puller.pull(3)  # three versions behind: the signed deltas, never a compacted one
            assert pulled.checksum == checksum(states[3]) and set(pulled.paths) == {"delta"}
            unsigned = await wc.compacted(0, 3)  # the server still composes one on request; no worker takes it
            with pytest.raises(WeightsRejectedError) as err:
                wc.verifier.check(unsigned)
            assert err.value.reason == "unsigned"


def _edit_manifest(path: Path, **fields: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


def _flip_payload(version_dir: Path) -> bytes:
    data = bytearray((version_dir / "payload").read_bytes())
    data[len(data) // 2] ^= 0x01
    (version_dir / "payload").write_bytes(data)
    return bytes(data)


def _tamper(version_dir: Path, how: str, other_key) -> None:
    manifest = version_dir / "manifest.json"
    m = Manifest.model_validate_json(manifest.read_text())
    if how == "manifest_edited":
        _edit_manifest(manifest, checksum="0" * 64)
    elif how == "payload_flipped":
        _flip_payload(version_dir)
    elif how == "payload_and_hashes_rewritten":  # the bytes changed and the manifest made to match them
        data = _flip_payload(version_dir)
        d = describe_payload(
            data,
            version=m.version,
            kind=m.kind,
            base_version=m.base_version,
            fmt=m.format,
            checksum=m.checksum,
            chunk_bytes=m.chunk_bytes,
        )
        _edit_manifest(manifest, sha256=d.sha256, chunks=[c.model_dump() for c in d.chunks])
    elif how == "signed_by_another_job":
        _edit_manifest(manifest, signature=base64.b64encode(other_key.sign(canonical_manifest(m))).decode())
    elif how == "signature_removed":
        _edit_manifest(manifest, signature=None)
    else:
        raise AssertionError(how)


TAMPERING = {
    "manifest_edited": "bad_signature",
    "payload_flipped": "payload",
    "payload_and_hashes_rewritten": "bad_signature",
    "signed_by_another_job": "bad_signature",
    "signature_removed": "unsigned",
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
async def test_tampered_version_is_refused_and_nothing_is_applied(tmp_path, creds, how) -> None:
    states = chain(3)
    other = generate(tmp_path / "other-job")
    ws = WeightServerProcess(tmp_path / "ws")
    version_dir = tmp_path / "ws" / "data" / "versions" / "1"
    with ws:
        await _publish(ws.url, creds, states)
    original = {p.name: p.read_bytes() for p in version_dir.iterdir() if p.is_file()}
    _tamper(version_dir, how, other.signing_key())
    with ws:  # restarted: it reloads the edited files from disk
        async with WeightClient(ws.url, verifier=ManifestVerifier(creds.verify_key()), retries=2) as wc:
            puller = WeightPuller(wc)
            held = await puller.pull(0)
            before, refused = _bits(held.state), _rejected(TAMPERING[how])
            with pytest.raises(WeightsError, match=TAMPERING[how]):
                await puller.pull(2)  # the plan 0 -> 2 goes through the tampered delta 1
            assert _rejected(TAMPERING[how]) == refused + 1
            assert puller.held is held and held.version == 0  # the held state is untouched: no bit of it moved
            assert all(torch.equal(before[k], t.view(torch.int16)) for k, t in held.state.items())
    for name, data in original.items():  # the weight-server's disk repaired: the worker's next try succeeds
        (version_dir / name).write_bytes(data)
    with ws:
        async with WeightClient(ws.url, verifier=ManifestVerifier(creds.verify_key())) as wc:
            assert (await WeightPuller(wc).pull(2)).checksum == checksum(states[2])


async def test_a_plan_that_skips_or_reorders_signed_versions_is_refused(tmp_path, creds) -> None:
    states = chain(3)
    with WeightServerProcess(tmp_path / "ws") as ws:
        await _publish(ws.url, creds, states)
        async with WeightClient(ws.url, verifier=ManifestVerifier(creds.verify_key())) as wc:
            full0, d1, d2 = [await wc.manifest(v) for v in range(3)]
            verifier = wc.verifier
            verifier.check_plan([full0, d1, d2], None, 2)  # the real chain verifies
            for plan, start, target in (([d2], 0, 2), ([d1], None, 1), ([full0, d1], None, 2), ([full0, d2], None, 2)):
                with pytest.raises(WeightsRejectedError) as err:
                    verifier.check_plan(plan, start, target)
                assert err.value.reason == "plan"
            with pytest.raises(WeightsRejectedError, match="asked for version 2"):
                verifier.check(d1, 2)  # a signed manifest, but of another version


async def test_a_refusal_after_a_delta_applied_in_place_drops_the_held_state(tmp_path, creds) -> None:
    states = chain(3)
    ws = WeightServerProcess(tmp_path / "ws")
    with ws:
        await _publish(ws.url, creds, states)
        _flip_payload(tmp_path / "ws" / "data" / "versions" / "2")  # payloads are read from disk on each request
        async with WeightClient(ws.url, verifier=ManifestVerifier(creds.verify_key()), retries=2) as wc:
            puller = WeightPuller(wc)
            await puller.pull(0)
            with pytest.raises(WeightsError, match="payload"):
                await puller.pull(2)  # delta 1 applies in place, then delta 2's bytes are refused
            assert puller.held is None  # that state is version 1's, not 0's: never a base again
            full = await puller.pull(1)  # so the next pull starts from the signed snapshot
            assert full.checksum == checksum(states[1]) and "full" in full.paths
