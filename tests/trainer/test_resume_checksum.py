"""Resume: the restored weights' checksum against the one a checkpoint recorded (trainer.loop._publish_initial).

A checkpoint written by an older rlboost recorded the former definition (sha256 of every byte): the error
must say so and what to do, and tell it apart from weights that were not restored exactly. The mismatch is
raised before any peer is contacted, so no weight-server is needed here (publisher=None).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlboost.weights.checksum import legacy_state_checksum, state_checksum
from rlboost.weights.safetensors_io import to_publish_dtype
from tests.trainer.conftest import tiny_spec
from trainer.checkpoint import CheckpointError
from trainer.loop import Trainer, TrainerOptions


def _trainer(tmp_path: Path, model_dir: Path, recorded: str) -> Trainer:
    opts = TrainerOptions(
        manager="127.0.0.1:1",
        weight_server="http://127.0.0.1:1",
        token="t",
        model_dir=model_dir,
        run_dir=tmp_path / "run",
        nats_url="nats://127.0.0.1:1",
    )
    trainer = Trainer(tiny_spec(), opts)
    trainer.checksum = recorded  # as _resume_point sets it from the checkpoint
    return trainer


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g)}


async def test_checkpoint_with_the_former_checksum_definition_says_older_rlboost(tmp_path, tiny_model_dir) -> None:
    state = _state()
    old = legacy_state_checksum(to_publish_dtype(state))
    assert old != state_checksum(to_publish_dtype(state))
    with pytest.raises(CheckpointError, match="written by an older rlboost") as err:
        await _trainer(tmp_path, tiny_model_dir, old)._publish_initial(None, state)
    assert "--resume" in str(err.value) and "rlboost version that wrote it" in str(err.value)


async def test_weights_not_restored_exactly_are_refused_with_both_causes_named(tmp_path, tiny_model_dir) -> None:
    state = _state()
    other = state_checksum(to_publish_dtype({k: v + 1 for k, v in state.items()}))
    with pytest.raises(CheckpointError, match="not restored exactly, or the checkpoint comes from another rlboost"):
        await _trainer(tmp_path, tiny_model_dir, other)._publish_initial(None, state)
