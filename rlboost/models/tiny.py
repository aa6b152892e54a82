"""The tiny Qwen3 policy: tokenizer from the task's text, seeded random init, brief supervised warm-up.

The warm-up teaches the answer format (digits then <|im_end|>) and a little arithmetic, so that RL
starts from a policy that sometimes succeeds. Everything is a function of the seeds: the same spec
gives bit-identical weights (on the same machine and torch build).

With an environment (task.environment) that offers `demonstration(task) -> messages` (the built-in calculator
does), the tokenizer and the warm-up learn from whole demonstrated episodes instead: the model's turns are the
labels, the environment's messages (built as the env-runner builds them, rlboost.environments.chat) are not.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from rlboost.models.errors import ModelError
from rlboost.models.tokenizer import IM_END, encode_prompt, stop_token_ids, train_tokenizer
from rlboost.spec import ModelSpec, TaskSpec
from rlboost.tasks import Example, Task

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

WARMUP_BATCH = 32
WARMUP_LR = 5e-3


def task_corpus(task: Task) -> list[str]:
    """The texts the tokenizer learns from: every example as a full chat exchange."""
    texts = []
    for ex in task.examples:
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in task.messages(ex))
        texts.append(f"{turns}<|im_start|>assistant\n{ex.answer}<|im_end|>\n")
    return texts


def build_model(model_spec: ModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A random-init Qwen3ForCausalLM sized by the spec, seeded by model_spec.seed."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if model_spec.hidden_size % model_spec.num_heads:
        raise ModelError(
            f"model.hiddenSize ({model_spec.hidden_size}) must be divisible by model.numHeads ({model_spec.num_heads})"
        )
    stops = stop_token_ids(tokenizer)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=model_spec.hidden_size,
        intermediate_size=model_spec.hidden_size * 2,
        num_hidden_layers=model_spec.num_layers,
        num_attention_heads=model_spec.num_heads,
        num_key_value_heads=math.gcd(model_spec.num_heads, 2),
        head_dim=model_spec.hidden_size // model_spec.num_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=stops,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's RNG
        torch.manual_seed(model_spec.seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = stops
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.float()


def demonstrations(task_spec: TaskSpec, task: Task) -> list[list[dict[str, str]]] | None:
    """The environment's demonstrated episode of every example (task.environment's `demonstration`), or None
    when the job has no environment or its environment offers none."""
    env = task_spec.environment
    if not env.name:
        return None
    from rlboost.environment_registry import load_registered

    demonstrate = getattr(load_registered(env.name)(**env.args), "demonstration", None)
    return [demonstrate(ex) for ex in task.examples] if callable(demonstrate) else None


def demonstration_corpus(demos: list[list[dict[str, str]]]) -> list[str]:
    """The texts the tokenizer learns from: every demonstrated episode as the chat template writes it."""
    return ["".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in demo) for demo in demos]


def demonstration_row(tokenizer: PreTrainedTokenizerBase, demo: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(ids, labels) of one demonstrated episode: the model's turns labelled, the rest -100."""
    from rlboost.environments.chat import ChatFormat

    fmt = ChatFormat(tokenizer, stop_token_ids(tokenizer))
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    turns = [i for i, m in enumerate(demo) if m["role"] == "assistant"]
    ids = fmt.prompt(demo[: turns[0]])
    labels = [-100] * len(ids)
    for n, i in enumerate(turns):
        turn = tokenizer.encode(demo[i]["content"], add_special_tokens=False) + [im_end]
        ids, labels = ids + turn, labels + turn
        if n + 1 < len(turns):
            env = fmt.after_turn(demo[i + 1 : turns[n + 1]], stopped=True)
            ids, labels = ids + env, labels + [-100] * len(env)
    return ids, labels


def warmup_tensors(
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    examples: list[Example],
    demos: list[list[dict[str, str]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) right-padded; labels are -100 except on answer + <|im_end|> (with
    `demos`: on every model turn of the demonstrated episodes)."""
    import torch

    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    rows, label_rows = [], []
    for ex in examples if demos is None else ():
        prompt = encode_prompt(tokenizer, task.messages(ex))
        answer = tokenizer.encode(ex.answer, add_special_tokens=False) + [im_end]
        rows.append(prompt + answer)
        label_rows.append([-100] * len(prompt) + answer)
    for demo in demos or ():
        row, labels = demonstration_row(tokenizer, demo)
        rows.append(row)
        label_rows.append(labels)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, lab) in enumerate(zip(rows, label_rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(row)] = 1
    return ids, mask, labels


def warm_up(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    steps: int,
    seed: int,
    demos: list[list[dict[str, str]]] | None = None,
) -> float:
    """`steps` AdamW steps of response-only cross-entropy on the task's examples (or `demos`, its environment's
    demonstrated episodes); returns the last loss."""
    import torch

    if steps == 0:
        return float("nan")
    ids, mask, labels = warmup_tensors(tokenizer, task, task.examples, demos)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        pick = torch.randint(0, ids.shape[0], (WARMUP_BATCH,), generator=gen)
        out = model(input_ids=ids[pick], attention_mask=mask[pick], labels=labels[pick])
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())


def create_tiny_model(model_spec: ModelSpec, task_spec: TaskSpec, out_dir: Path) -> None:
    """Train the tokenizer, build and warm up the model, and save both (float32 safetensors) in out_dir."""
    import torch

    from rlboost.tasks.dataset import warmup_task

    task = warmup_task(task_spec)  # a dataset's first rows, or the built-in task
    demos = demonstrations(task_spec, task)  # an environment's whole episodes, where it demonstrates them
    tokenizer = train_tokenizer(task_corpus(task) if demos is None else demonstration_corpus(demos))
    # One thread: the result then cannot depend on the core count, and for ops this small it is also
    # faster than two threads contending on a busy machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = build_model(model_spec, tokenizer)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(model_spec.seed)
            loss = warm_up(model, tokenizer, task, model_spec.warmup_steps, model_spec.seed, demos)
    finally:
        torch.set_num_threads(threads)
    log.info(
        "tiny model: %d parameters, vocab %d, warm-up %d steps, final loss %.4f",
        sum(p.numel() for p in model.parameters()),
        len(tokenizer),
        model_spec.warmup_steps,
        loss,
    )
    _save_quietly(model, tokenizer, out_dir)


def _save_quietly(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """save_pretrained without transformers' progress bar, which would break JSON log lines."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out_dir))
        tokenizer.save_pretrained(str(out_dir))
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
