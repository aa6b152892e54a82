"""The registry of reward functions: entry points in the group `rlboost.rewards`, found without importing them.

`task.reward` names an entry point, never a module path: a job spec can only pick a reward some installed
package registered on purpose (the built-ins in rlboost.tasks.rewards, user packages in their pyproject.toml:
`[project.entry-points."rlboost.rewards"]  my_reward = "my_pkg.rewards:score"`). The old 'module:function'
form let a spec run any importable callable on model output (`cProfile:run` executed the text).

The built-ins are also listed here (`BUILTIN_REWARDS`, equal to pyproject.toml's table, a test checks it) so a
source checkout whose installed metadata predates them still finds them. Nothing here imports a reward:
spec validation and the operator read only package metadata. Loading (importing) happens in the reward
sandbox (rlboost.tasks.sandbox).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

REWARD_GROUP = "rlboost.rewards"
BUILTIN_REWARDS: dict[str, str] = {
    "exact_match": "rlboost.tasks.rewards:exact_match",
    "format": "rlboost.tasks.verifiers:answer_format",
    "format_reward": "rlboost.tasks.rewards:format_reward",
    "math_answer": "rlboost.tasks.rewards:math_answer",
    "math_verify": "rlboost.tasks.verifiers:math_verify",
    "reasoning_gym": "rlboost.tasks.reasoning_gym:score",
    "regex_match": "rlboost.tasks.verifiers:regex_match",
}
# An entry point name as packaging allows it (no ':' so the old form is told apart).
REWARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
REGISTER_HINT = (
    'register it as an entry point in its package\'s pyproject.toml: [project.entry-points."rlboost.rewards"] '
    'my_reward = "my_pkg.module:function", install the package, and set task.reward: my_reward'
)


class RewardNameError(ValueError):
    """`task.reward` names no registered reward; the message names the field, the choices and the fix."""


def registered_rewards() -> dict[str, str]:
    """Every registered reward: name -> 'module:attr' (built-ins first; a package cannot replace a built-in)."""
    found = {ep.name: ep.value for ep in entry_points(group=REWARD_GROUP)}
    return {**found, **BUILTIN_REWARDS}


def check_reward_name(name: str) -> str:
    """The entry point ('module:attr') that `name` resolves to, or RewardNameError saying what to do."""
    if ":" in name:
        raise RewardNameError(
            f"task.reward {name!r} is a 'module:function' path; rewards are now named entry points "
            f"(built-ins: {', '.join(BUILTIN_REWARDS)}). To use your own function, {REGISTER_HINT}"
        )
    if not REWARD_NAME.match(name):
        raise RewardNameError(f"task.reward {name!r} is not an entry point name (letters, digits, '_', '.', '-')")
    available = registered_rewards()
    if name not in available:
        raise RewardNameError(
            f"task.reward {name!r} is not a registered reward; available: {', '.join(sorted(available))}. "
            f"To add one, {REGISTER_HINT}"
        )
    return available[name]


def load_registered(name: str) -> Callable[..., Any]:
    """Import and return the reward `name` (registered; see check_reward_name). Runs the reward's module code:
    call it only where the reward is meant to run (the sandbox)."""
    target = check_reward_name(name)
    module_name, _, attr = target.partition(":")
    fn: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardNameError(f"task.reward {name!r}: entry point {target!r} is a {type(fn).__name__}, not callable")
    return fn


RewardTerms = list[tuple[str, float, dict[str, Any]]]  # (entry point name, weight, keyword parameters)


def reward_terms(reward: str | Sequence[Any]) -> RewardTerms:
    """`task.reward` as the sandbox runs it: a name is one term of weight 1 without parameters; a weighted list
    (items with .name, .weight, .params, as rlboost.spec.RewardTerm) gives one term each."""
    if isinstance(reward, str):
        return [(reward, 1.0, {})]
    return [(term.name, float(term.weight), dict(term.params)) for term in reward]


def describe_reward(reward: str | Sequence[Any]) -> str:
    """A short text of `task.reward` for logs ('math_verify' or '1*math_verify + 0.1*format')."""
    if isinstance(reward, str):
        return reward
    return " + ".join(f"{weight:g}*{name}" for name, weight, _ in reward_terms(reward))
