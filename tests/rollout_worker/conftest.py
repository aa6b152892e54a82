"""Fixtures for the rollout-worker tests: a tiny random-init Qwen3 model directory (≈30k parameters)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


def make_tiny_model(path: Path, seed: int = 0) -> Path:
    """Save a tiny Qwen3 causal LM (bf16 on disk, like the weights the trainer publishes) to `path`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.3,  # large weights so logits are decisive (no near-ties between float paths)
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"))
