"""bf16 publication against a real weight-server process: the uploaded payload is the bf16 cast, bit for bit."""

from __future__ import annotations

import torch
from trainer.publisher import WeightPublisher, publish_state

from rlboost.weights.checksum import state_checksum
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_from_bytes
from tests.trainer.peers import TOKEN, WeightServerProcess


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
