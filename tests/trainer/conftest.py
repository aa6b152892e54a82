"""Fixtures of the trainer tests: one tiny Qwen3 model directory (with tokenizer) per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.spec import JobSpec


def tiny_spec(**algorithm: object) -> JobSpec:
    """A job spec small enough for seconds-long CPU steps."""
    alg = {"prompts_per_step": 2, "group_size": 2, "micro_batch_size": 2, "max_new_tokens": 4, "learning_rate": 1e-2}
    alg.update(algorithm)
    return JobSpec.model_validate(
        {
            "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "warmup_steps": 0},
            "task": {"num_prompts": 16},
            "algorithm": alg,
            "trainer": {"zero_stage": 1},
        }
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A random-init tiny Qwen3 + trained tokenizer, created once (rlboost.models.ensure_model)."""
    from rlboost.models import ensure_model

    spec = tiny_spec()
    return ensure_model(spec.model, spec.task, tmp_path_factory.mktemp("trainer-model") / "model")
