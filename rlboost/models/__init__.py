"""Model and tokenizer factory: the tiny Qwen3 policy for local runs, and tokenizer helpers.

    path = ensure_model(spec.model, spec.task, run_dir / "model")   # create once, then reuse
    tok = load_tokenizer(path); ids = encode_prompt(tok, task.messages(example))

Heavy imports (torch, transformers, tokenizers) happen inside the functions, so importing this
package is cheap.
"""

from __future__ import annotations

from rlboost.models.errors import ModelError
from rlboost.models.factory import ensure_model
from rlboost.models.layout import is_model_dir
from rlboost.models.tokenizer import (
    END_OF_TEXT,
    IM_END,
    IM_START,
    decode_response,
    encode_prompt,
    load_tokenizer,
    stop_token_ids,
)

__all__ = [
    "END_OF_TEXT",
    "IM_END",
    "IM_START",
    "ModelError",
    "decode_response",
    "encode_prompt",
    "ensure_model",
    "is_model_dir",
    "load_tokenizer",
    "stop_token_ids",
]
