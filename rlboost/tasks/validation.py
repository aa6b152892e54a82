"""Where the validation prompts come from: the `ValidationSource` interface and the built-in task's own.

The trainer evaluates (spec.evaluation) on `validation_source(spec).validation_examples(n)`: prompts with their
reference answers and metadata, the same list every time (so evaluations of one run compare). The addition task
generates a seeded held-out set (its own seed stream, so it does not repeat the training order; with small
operands the questions may still coincide with training ones). A dataset's validation split plugs in by
implementing `ValidationSource` and returning it from `validation_source`.
"""

from __future__ import annotations

import random
from typing import Protocol

from rlboost.spec import JobSpec, TaskSpec
from rlboost.tasks.base import Example


class ValidationSource(Protocol):
    """Validation prompts with reference answers, in a fixed order."""

    def validation_examples(self, limit: int) -> list[Example]:
        """The first `limit` validation examples (fewer when the source has fewer); never empty."""
        ...


class AdditionValidation:
    """The addition task's held-out questions: 'What is a+b?' from the seed stream '<task.seed>:validation'."""

    def __init__(self, task: TaskSpec) -> None:
        self.task = task

    def validation_examples(self, limit: int) -> list[Example]:
        rng = random.Random(f"{self.task.seed}:validation")  # a string seed: stable across processes
        top = self.task.max_operand
        out = []
        for _ in range(limit):
            a, b = rng.randint(0, top), rng.randint(0, top)
            out.append(Example(question=f"What is {a}+{b}?", answer=str(a + b)))
        return out


def validation_source(spec: JobSpec) -> ValidationSource:
    """The validation prompts of the job's task (the built-in task's own held-out generator)."""
    if spec.task.name == "addition":
        return AdditionValidation(spec.task)
    raise ValueError(f"task.name {spec.task.name!r} has no validation source; allowed: 'addition'")
