"""reasoning-gym's procedural tasks as the job's prompts (task.dataset.reasoningGym), scored by reasoning-gym itself.

    task:
      dataset:
        reasoningGym: {name: basic_arithmetic, size: 2000, seed: 7, config: {max_terms: 2, max_digits: 1}}

`reasoning_gym_task` generates the tasks once from the seed (the same seed, the same tasks, on every process that asks)
into a built-in-style Task, each Example's metadata holding the generated entry; the `reasoning_gym` reward scores
a response with that dataset's own `score_answer` (the answer inside `<answer>...</answer>` when the response has
one, else the response's text up to its end-of-turn). PyPI `reasoning-gym` (the `environments` extra) is imported
with this module, which only such a job loads: never at spec validation (the import takes seconds). With the module,
so that the reward sandbox has it loaded before its audit hook refuses the code an import generates.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from rlboost.spec import ReasoningGymSpec
from rlboost.tasks.base import Example
from rlboost.tasks.rewards import final_text

try:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer
except ImportError:  # named with the fix when a job asks for it (_module)
    reasoning_gym = None

KEY = "reasoning_gym"  # Example.metadata[KEY] = {"name": dataset name, "entry": the generated entry}
FIELD = "task.dataset.reasoningGym"


class ReasoningGymError(ValueError):
    """A reasoning-gym dataset that cannot be generated; the message names the field and the fix."""


def _module() -> Any:
    if reasoning_gym is None:
        raise ReasoningGymError(
            f"{FIELD}: the reasoning-gym package is not installed; install rlboost[environments] (or "
            "`pip install reasoning-gym`) where the trainer runs"
        )
    return reasoning_gym


def dataset_names() -> list[str]:
    _module()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_name(name: str) -> None:
    names = dataset_names()
    if name not in names:
        raise ReasoningGymError(
            f"{FIELD}.name {name!r} is not a reasoning-gym dataset; choose one of {len(names)}, e.g. "
            f"{', '.join(n for n in names if n in _EXAMPLES) or ', '.join(names[:5])}"
        )


_EXAMPLES = ("basic_arithmetic", "chain_sum", "letter_counting", "spell_backward", "gsm_symbolic")


def reasoning_gym_examples(spec: ReasoningGymSpec) -> list[Example]:
    """The `size` tasks the seed generates, in the generator's order."""
    check_name(spec.name)
    try:
        data = _module().create_dataset(spec.name, size=spec.size, seed=spec.seed, **spec.config)
    except (TypeError, ValueError, AssertionError) as err:  # the dataset's config refused an argument
        raise ReasoningGymError(f"{FIELD}.config: {spec.name} refuses it: {type(err).__name__}: {err}") from None
    return [_example(spec.name, entry) for entry in data]


def _example(name: str, entry: dict[str, Any]) -> Example:
    plain = json.loads(json.dumps(entry, default=str))  # the reward sandbox's wire carries JSON only
    return Example(
        question=plain["question"], answer=str(plain["answer"]), metadata={KEY: {"name": name, "entry": plain}}
    )


@functools.cache
def _scorer(name: str) -> Any:
    return _module().get_score_answer_fn(name)


def score(response_text: str, example: Example) -> float:
    """The `reasoning_gym` reward: the task's own score_answer of the response's answer (0..1)."""
    info = example.metadata.get(KEY) if example.metadata else None
    if not isinstance(info, dict):
        raise ValueError(f"the reasoning_gym reward scores the prompts of {FIELD} only")
    answer = extract_answer(response_text) or final_text(response_text)
    return float(_scorer(info["name"])(answer, info["entry"]))
