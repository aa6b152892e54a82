"""A byte-level BPE tokenizer trained in-process on a task's text, with a Qwen-style chat template.

Digits are split one per token (so every number is spelled the same way in prompts and answers);
the special tokens are those of Qwen chat models: <|im_start|>, <|im_end|> (end of turn, the eos)
and <|endoftext|> (padding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = [END_OF_TEXT, IM_START, IM_END]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 320) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on `texts` and wrap it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer saved in a model directory."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, Any]], enable_thinking: bool | None = None
) -> list[int]:
    """The chat prompt's token ids through the tokenizer's chat template, ending with the assistant's generation
    prompt; `enable_thinking` (None = the template's default) is passed to templates that read it."""
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False, **extra)
    return list(tokenizer.encode(text, add_special_tokens=False))


def chat_template_record(tokenizer: PreTrainedTokenizerBase, enable_thinking: bool | None, system_prompt: str) -> dict:
    """What the run records about its prompt formatting: the template's text and sha256, whether it reads
    `enable_thinking`, and the settings passed to it."""
    import hashlib

    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return {
        "sha256": hashlib.sha256(template.encode()).hexdigest(),
        "reads_enable_thinking": "enable_thinking" in template,
        "enable_thinking": enable_thinking,
        "system_prompt": system_prompt,
        "template": template,
    }


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Token ids that end a response: <|im_end|> and <|endoftext|> (those the vocabulary has)."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in (IM_END, END_OF_TEXT) if t in vocab]


def decode_response(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """The response's text with special tokens dropped."""
    return tokenizer.decode(list(ids), skip_special_tokens=True)
