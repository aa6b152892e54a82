"""The task abstraction and the built-in 'addition' task.

A task is a fixed list of examples generated from the spec's seed, plus a batch order that is a pure
function of (seed, step): each epoch visits every example once in a seeded shuffle, so a resumed trainer
gets the same batches from the step number alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from rlboost.spec import TaskSpec


@dataclass(frozen=True)
class Example:
    """One prompt, its reference answer (both plain text) and per-row metadata handed to the reward."""

    question: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)  # JSON values; the reward sees example.metadata


class Task:
    """A seeded prompt set with a deterministic, resumable batch order."""

    def __init__(self, name: str, examples: list[Example], seed: int) -> None:
        if not examples:
            raise ValueError(f"task {name!r} has no examples; raise task.numPrompts")
        self.name = name
        self.examples = examples
        self.seed = seed

    def _epoch_order(self, epoch: int) -> list[int]:
        # A string seed keeps the permutation stable across Python versions and processes (no hash()).
        order = list(range(len(self.examples)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def batch(self, step: int, n: int) -> list[tuple[int, Example]]:
        """The `n` examples of `step` with their dataset indices; depends only on (seed, step, n)."""
        if step < 0 or n < 1:
            raise ValueError(f"batch needs step >= 0 and n >= 1, got step={step}, n={n}")
        size = len(self.examples)
        out: list[tuple[int, Example]] = []
        cached_epoch, order = -1, []
        for g in range(step * n, (step + 1) * n):
            epoch, pos = divmod(g, size)
            if epoch != cached_epoch:
                cached_epoch, order = epoch, self._epoch_order(epoch)
            idx = order[pos]
            out.append((idx, self.examples[idx]))
        return out

    def messages(self, example: Example) -> list[dict[str, str]]:
        """The chat messages of an example: a single user turn."""
        return [{"role": "user", "content": example.question}]


def addition_examples(spec: TaskSpec) -> list[Example]:
    """`num_prompts` questions 'What is a+b?' with a, b uniform in 0..max_operand, from the seed."""
    rng = random.Random(spec.seed)
    out = []
    for _ in range(spec.num_prompts):
        a, b = rng.randint(0, spec.max_operand), rng.randint(0, spec.max_operand)
        out.append(Example(question=f"What is {a}+{b}?", answer=str(a + b)))
    return out


def make_task(spec: TaskSpec) -> Task:
    """Build the task named by `spec.name`."""
    if spec.name == "addition":
        return Task(spec.name, addition_examples(spec), spec.seed)
    raise ValueError(f"unknown task.name {spec.name!r}; allowed: 'addition'")
