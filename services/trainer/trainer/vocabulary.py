"""The model's vocabulary as the trainer uses it: its tokenizer, stop ids, pad id, size, and response decoding.

Loaded once from the model directory at start (a directory without a tokenizer fails the start, not a step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer and the token ids the trainer sends with each Rollout and pads micro-batches with."""

    tokenizer: Any  # the model directory's Hugging Face tokenizer (chat template included)
    stop_ids: tuple[int, ...]  # generation stops at any of them (SamplingParams.stop_token_ids)
    pad_id: int  # the tokenizer's pad id, else the first stop id, else 0
    size: int  # config.json's vocab_size: the manager refuses token ids outside it (0: unchecked)

    @classmethod
    def load(cls, model_dir: Path) -> Vocabulary:
        from rlboost.models import load_tokenizer, stop_token_ids

        tokenizer = load_tokenizer(model_dir)
        stop_ids = tuple(stop_token_ids(tokenizer))
        pad = tokenizer.pad_token_id
        pad_id = int(pad) if pad is not None else (stop_ids[0] if stop_ids else 0)
        return cls(tokenizer, stop_ids, pad_id, vocab_size(model_dir))

    def decode(self, response_ids: list[int]) -> str:
        """A response's text, as the reward reads it."""
        from rlboost.models import decode_response

        return decode_response(self.tokenizer, response_ids)


def vocab_size(model_dir: Path) -> int:
    """The model's vocabulary size (its config.json), sent with each Rollout so the manager refuses token ids
    outside it; 0 (unchecked) when the config does not say."""
    try:
        value = json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0)
    except (OSError, ValueError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0
