"""The model's assets signed, against a real weight-server process: the trainer uploads its model directory's
assets with a signed asset manifest (sha256 per file); a verifying worker writes only assets that match it, and a
tokenizer edited on the weight-server's disk (restarted, so it lists the edit's own sha256) is refused before a
file is written, and counted. A client without the job's key still takes whatever is served."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from rlboost.auth.credentials import JobCredentials, generate
from rlboost.weights.client import WeightClient
from rlboost.weights.signing import ASSET_MANIFEST, ManifestSigner, ManifestVerifier, WeightsRejectedError
from rollout_worker.__main__ import StartupError, _pull_assets
from tests.trainer.peers import TOKEN, WeightServerProcess
from tests.weight_server.states import chain
from trainer.publisher import WeightPublisher, upload_model_assets

CHUNK = 16 << 10
CONFIG, TOKENIZER = b'{"model_type": "qwen3", "hidden_size": 32}', b'{"model": {"vocab": {"a": 0, "b": 1}}}'


@pytest.fixture
def creds(tmp_path: Path) -> JobCredentials:
    return generate(tmp_path / "credentials")


async def _publish(url: str, creds: JobCredentials, model_dir: Path) -> None:
    """What the trainer does before its first version: assets (signed), then version 0."""
    model_dir.mkdir()
    (model_dir / "config.json").write_bytes(CONFIG)
    (model_dir / "tokenizer.json").write_bytes(TOKENIZER)
    async with WeightClient(url, token=TOKEN) as wc:
        signer = ManifestSigner(creds.signing_key(), CHUNK)
        assert await upload_model_assets(wc, model_dir, signer) == ["config.json", "tokenizer.json", ASSET_MANIFEST]
        await WeightPublisher(wc, signer=signer).publish(0, chain(1)[0])


def _verifying(url: str, creds: JobCredentials) -> WeightClient:
    return WeightClient(url, verifier=ManifestVerifier(creds.verify_key()))


def _rejected(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_worker_weight_rejected_total", {"reason": reason}) or 0.0


async def test_signed_assets_are_pulled_and_a_tampered_tokenizer_is_refused(tmp_path: Path, creds) -> None:
    with WeightServerProcess(tmp_path / "ws") as ws:
        await _publish(ws.url, creds, tmp_path / "trainer-model")
        async with _verifying(ws.url, creds) as wc:
            written = await wc.pull_assets(tmp_path / "good")
        assert sorted(p.name for p in written) == ["config.json", "tokenizer.json"]  # the manifest is not a file
        assert (tmp_path / "good" / "tokenizer.json").read_bytes() == TOKENIZER
        ws.kill()

    (tmp_path / "ws" / "data" / "assets" / "tokenizer.json").write_bytes(b'{"model": {"vocab": {"evil": 0}}}')
    with WeightServerProcess(tmp_path / "ws") as ws:  # it recomputes sha256s: it lists the edit as its own
        before = _rejected("asset")
        async with _verifying(ws.url, creds) as wc:
            with pytest.raises(StartupError, match="model assets refused"):
                await _pull_assets(wc, ws.url, str(tmp_path / "bad"), timeout=10)
        assert _rejected("asset") == before + 1
        assert not (tmp_path / "bad").exists() or not list((tmp_path / "bad").iterdir()), "nothing written"
        async with WeightClient(ws.url) as unverified:  # no job key: takes what is served (why workers verify)
            await unverified.pull_assets(tmp_path / "open")
        assert b"evil" in (tmp_path / "open" / "tokenizer.json").read_bytes()


async def test_a_forged_or_missing_asset_manifest_is_refused(tmp_path: Path, creds) -> None:
    with WeightServerProcess(tmp_path / "ws") as ws:
        await _publish(ws.url, creds, tmp_path / "trainer-model")
        ws.kill()
    signed = tmp_path / "ws" / "data" / "assets" / ASSET_MANIFEST
    doc = json.loads(signed.read_text())
    doc["assets"]["tokenizer.json"] = "0" * 64  # a forger's sha256 under the trainer's signature
    signed.write_text(json.dumps(doc))
    for reason in ("bad_signature", "unsigned"):
        with WeightServerProcess(tmp_path / "ws") as ws:
            async with _verifying(ws.url, creds) as wc:
                with pytest.raises(WeightsRejectedError) as err:
                    await wc.pull_assets(tmp_path / reason)
            assert err.value.reason == reason
            ws.kill()
        signed.unlink(missing_ok=True)  # then: a server that holds no asset manifest at all


@pytest.mark.parametrize(
    "document",
    [b"", b"not json", b"[]", b'{"assets": []}', b'{"assets": {"a": 1}, "signature": "x"}', b'{"signature": "AA=="}'],
)
def test_a_malformed_asset_manifest_is_a_bad_signature_not_a_traceback(creds, document: bytes) -> None:
    with pytest.raises(WeightsRejectedError) as err:
        ManifestVerifier(creds.verify_key()).check_assets(document)
    assert err.value.reason == "bad_signature"


def test_an_asset_manifest_signature_is_deterministic_and_bound_to_the_job(creds, tmp_path: Path) -> None:
    signer = ManifestSigner(creds.signing_key(), CHUNK)
    document = signer.sign_assets({"config.json": CONFIG})
    assert signer.sign_assets({"config.json": CONFIG}) == document  # a resumed trainer uploads the same bytes
    assert ManifestVerifier(creds.verify_key()).check_assets(document) == {
        "config.json": hashlib.sha256(CONFIG).hexdigest()
    }
    other = generate(tmp_path / "other-job")
    with pytest.raises(WeightsRejectedError):
        ManifestVerifier(other.verify_key()).check_assets(document)
