"""The interface of a plain Python environment (`rlboost.environments` entry points), and its replies made uniform.

An episode: `reset(task)` gives the first messages (the prompt; a system message with the tools' descriptions, the
user's question); then, for each model turn, `step(action)` takes the turn's text and returns what the environment
says back (tool results, a user's reply) as messages, whether the episode is over, and its reward once it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rlboost.tasks.base import Example

Message = dict[str, str]  # {"role": "system" | "user" | "assistant" | "tool", "content": text}
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class Step:
    """What the environment says after a model turn."""

    observation: list[Message]  # appended to the conversation before the next turn (empty when done)
    reward: float | None = None  # the episode's reward, when done (None: task.reward judges the episode)
    done: bool = False
    tool_calls: int = 0  # tools this step ran
    tool_failures: int = 0  # of those, calls that failed (malformed, unknown tool, the tool raised)


class Environment(Protocol):
    """What a registered environment's factory returns (one object serves many episodes, one at a time)."""

    def reset(self, task: Example) -> list[Message]: ...

    def step(self, action: str) -> Step: ...


class EnvironmentReplyError(ValueError):
    """An environment returned something that is not a reply; the message says what."""


def messages_from(value: Any, what: str) -> list[Message]:
    """`value` as chat messages: a string is one user message; a list must hold {role, content} dicts."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list | tuple):
        raise EnvironmentReplyError(f"{what}: expected messages (a list of {{role, content}}) or text")
    out = []
    for m in value:
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise EnvironmentReplyError(f"{what}: {str(m)[:80]} is not a {{role, content}} message")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def step_from(value: Any) -> Step:
    """A step's reply made a Step: a Step, or a gym-style (observation, reward, done) tuple."""
    if isinstance(value, tuple) and len(value) in (3, 4):
        observation, reward, done = value[:3]
        value = Step(messages_from(observation or [], "step() observation"), reward, bool(done))
    if not isinstance(value, Step):
        raise EnvironmentReplyError(
            f"step() returned {type(value).__name__}; return a Step or (observation, reward, done)"
        )
    value.observation = messages_from(value.observation, "step() observation")
    reward = value.reward
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise EnvironmentReplyError(f"step() reward {value.reward!r} is not a number")
    return value
