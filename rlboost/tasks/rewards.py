"""Reward functions `(response_text, example) -> float` and the loader of `task.reward` entry points.

A reward is any importable callable named as 'module:function' in the job spec (field `task.reward`).
Built-ins: `exact_match` (the answer, nothing else) and `format_reward` (just an integer).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from rlboost.tasks.base import Example

RewardFn = Callable[[str, Example], float]

# End-of-turn markers a decoder may leave in the text; everything from the first one on is ignored.
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")
_INTEGER = re.compile(r"-?\d+")


class RewardLoadError(ValueError):
    """`task.reward` names nothing callable; the message says what is wrong and how to fix it."""


def _final_text(response_text: str) -> str:
    cut = len(response_text)
    for marker in _END_MARKERS:
        i = response_text.find(marker)
        if i != -1:
            cut = min(cut, i)
    return response_text[:cut].strip()


def exact_match(response_text: str, example: Example) -> float:
    """1.0 when the response (stripped, up to an end-of-turn marker) equals the answer, else 0.0."""
    return 1.0 if _final_text(response_text) == example.answer.strip() else 0.0


def format_reward(response_text: str, example: Example) -> float:
    """1.0 when the response (stripped, up to an end-of-turn marker) is only an integer, else 0.0."""
    return 1.0 if _INTEGER.fullmatch(_final_text(response_text)) else 0.0


def load_reward(entry: str) -> RewardFn:
    """Resolve 'module:function' to a callable, or raise RewardLoadError naming `task.reward`."""
    module_name, sep, attr = entry.partition(":")
    if not sep or not module_name or not attr:
        raise RewardLoadError(
            f"task.reward {entry!r} must be 'module:function', e.g. 'rlboost.tasks.rewards:exact_match'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RewardLoadError(
            f"task.reward {entry!r}: cannot import module {module_name!r} ({err}); check the module path"
        ) from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardLoadError(f"task.reward {entry!r}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardLoadError(
            f"task.reward {entry!r}: {attr!r} is a {type(fn).__name__}, not a function (response_text, example) -> float"
        )
    return fn
