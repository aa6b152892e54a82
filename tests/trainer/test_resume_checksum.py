"""Resume: the restored weights' checksum against the one a checkpoint recorded (trainer.versions.WeightVersions,
publishing the starting weights).

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
from trainer.checkpoint import CheckpointError
from trainer.versions import WeightVersions


def _versions(recorded: str) -> WeightVersions:
    versions = WeightVersions()
    versions.resume_at(4, recorded)  # as the trainer's resume point sets it from the checkpoint
    return versions


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g)}


async def test_checkpoint_with_the_former_checksum_definition_says_older_rlboost(tiny_model_dir: Path) -> None:
    state = _state()
    old = legacy_state_checksum(to_publish_dtype(state))
    assert old != state_checksum(to_publish_dtype(state))
    with pytest.raises(CheckpointError, match="written by an older rlboost") as err:
        await _versions(old).publish_start(None, state, tiny_model_dir)
    assert "--resume" in str(err.value) and "rlboost version that wrote it" in str(err.value)


async def test_weights_not_restored_exactly_are_refused_with_both_causes_named(tiny_model_dir: Path) -> None:
    state = _state()
    other = state_checksum(to_publish_dtype({k: v + 1 for k, v in state.items()}))
    with pytest.raises(CheckpointError, match="not restored exactly, or the checkpoint comes from another rlboost"):
        await _versions(other).publish_start(None, state, tiny_model_dir)
