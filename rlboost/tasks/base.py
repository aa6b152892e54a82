"""The task abstraction and the built-in 'addition' task.

A task is a fixed list of examples generated from the spec's seed, plus a batch order that is a pure
function of (seed, step): each epoch visits every example once in a seeded shuffle, so a resumed trainer
gets the same batches from the step number alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlboost.spec import TaskSpec


@dataclass(frozen=True)
class Example:
    """One prompt and its reference answer (both plain text); a dataset row may add chat messages and metadata.

    `question` is the prompt's text (for a chat prompt: its last user turn); `messages`, when set, is the whole
    chat-form prompt; `metadata` holds the row's task.dataset.metadataFields for the reward (JSON values)."""

    question: str
    answer: str
    messages: tuple[dict[str, str], ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.messages, list):  # arrives as a JSON list in the reward sandbox
            object.__setattr__(self, "messages", tuple(self.messages))


@dataclass(frozen=True)
class Cursor:
    """Where a prompt stream stands: the epoch and the position in that epoch's order (checkpointed)."""

    epoch: int = 0
    position: int = 0


@dataclass
class PromptBatch:
    """A step's prompts: examples, their token ids, rows skipped for length, and the cursor after them.

    Fewer examples than asked for means the stream ended (task.dataset.epochs passed)."""

    examples: list[Example]
    prompt_ids: list[list[int]]
    skipped: int
    cursor: Cursor


Encoder = Callable[[list[dict[str, str]]], list[int]]  # chat messages -> prompt token ids (the chat template)


class Task:
    """A seeded prompt set with a deterministic, resumable batch order."""

    def __init__(self, name: str, examples: list[Example], seed: int, system_prompt: str = "") -> None:
        if not examples:
            raise ValueError(f"task {name!r} has no examples; raise task.numPrompts")
        self.name = name
        self.examples = examples
        self.seed = seed
        self.system_prompt = system_prompt

    def _epoch_order(self, epoch: int) -> list[int]:
        # A string seed keeps the permutation stable across Python versions and processes (no hash()).
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def batch(self, step: int, n: int) -> list[tuple[int, Example]]:
        """The `n` examples of `step` with their dataset indices; depends only on (seed, step, n)."""
        if step < 0 or n < 1:
            raise ValueError(f"batch needs step >= 0 and n >= 1, got step={step}, n={n}")
        return self._run(step * n, n)

    def _run(self, start: int, n: int) -> list[tuple[int, Example]]:
        """The `n` examples at global positions start.. (epoch after epoch, each in its seeded order)."""
        size = len(self.examples)
        out: list[tuple[int, Example]] = []
        cached_epoch, order = -1, []
        for g in range(start, start + n):
            epoch, pos = divmod(g, size)
            if epoch != cached_epoch:
                cached_epoch, order = epoch, self._epoch_order(epoch)
            idx = order[pos]
            out.append((idx, self.examples[idx]))
        return out

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The chat messages of an example: its own (a dataset's chat prompt) or a single user turn."""
        return prompt_messages(example, self.system_prompt)

    def take(self, cursor: Cursor, n: int, encode: Encoder) -> PromptBatch:
        """The `n` examples from `cursor` on (the order of `batch`: take from (0, 0) with the same n each step
        gives batch(0, n), batch(1, n), ...; partial rollout takes a varying n); the generated task never ends."""
        start = cursor.epoch * len(self.examples) + cursor.position
        examples = [ex for _, ex in self._run(start, n)]
        epoch, position = divmod(start + n, len(self.examples))
        return PromptBatch(examples, [encode(self.messages(ex)) for ex in examples], 0, Cursor(epoch, position))


def prompt_messages(example: Example, system_prompt: str = "") -> list[dict[str, str]]:
    """The chat messages of an example: its own, or one user turn; the system prompt first where none is."""
    messages = list(example.messages) if example.messages else [{"role": "user", "content": example.question}]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def addition_examples(spec: TaskSpec) -> list[Example]:
    """`num_prompts` questions 'What is a+b?' with a, b uniform in 0..max_operand, from the seed."""
    rng = random.Random(spec.seed)
    out = []
    for _ in range(spec.num_prompts):
        a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
        out.append(Example(question=f"What is {a}+{b}?", answer=str(a + b)))
    return out


def multiplication_examples(spec: TaskSpec) -> list[Example]:
    """`num_prompts` questions 'What is a*b?' with a, b uniform in 0..max_operand, from the seed."""
    rng = random.Random(f"{spec.seed}:multiplication")
    out = []
    for _ in range(spec.num_prompts):
        a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
        out.append(Example(question=f"What is {a}*{b}?", answer=str(a * b)))
    return out


def make_task(spec: TaskSpec) -> Task:
    """Build the task named by `spec.name` (the built-in prompts; a dataset, reasoning-gym's generated tasks and a
    verifiers environment's own tasks are the prompts of rlboost.tasks.dataset.make_prompts)."""
    if spec.name == "addition":
        return Task(spec.name, addition_examples(spec), spec.seed)
    if spec.name == "multiplication":
        return Task(spec.name, multiplication_examples(spec), spec.seed)
    raise ValueError(f"unknown task.name {spec.name!r}; allowed: 'addition', 'multiplication'")
