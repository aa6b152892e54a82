"""Tool calling: Python functions as tools, the model's calls parsed from its text, their results as observations.

The call format is the one Qwen, Hermes and most open chat models are trained on (and the OpenAI-compatible
endpoint parses into `tool_calls`):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "12*34"}}
    </tool_call>

`ToolEnvironment` is an `Environment` whose `step` runs every call in the turn, each result a `tool` message. A
turn with no call is the model's final answer: the episode ends and `score(answer, task)` is its reward. A call
that cannot be parsed, names no tool, has the wrong arguments or raises is answered with a `tool` message naming
the error (counted in `tool_failures`): a malformed tool call is an observation, never a crash of the episode.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlboost.environments.base import Message, Step
from rlboost.tasks.base import Example, prompt_messages

TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
MAX_RESULT_CHARS = 4000  # a tool's result is cut to this many characters in the observation


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallError(ValueError):
    """A tool call the model wrote that cannot be run; the message is what the model is told."""


def parse_tool_calls(text: str) -> list[ToolCall | ToolCallError]:
    """Every `<tool_call>` block of a turn, in order: a ToolCall, or the ToolCallError saying what is wrong."""
    out: list[ToolCall | ToolCallError] = []
    for block in TOOL_CALL.findall(text):
        try:
            value = json.loads(block.strip())
        except ValueError as err:
            out.append(ToolCallError(f"the tool call is not JSON ({err.msg} at character {err.pos})"))
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            out.append(ToolCallError('a tool call is {"name": <tool>, "arguments": {...}}'))
            continue
        arguments = value.get("arguments", {})
        if isinstance(arguments, str):  # some models send the arguments JSON-encoded, as the OpenAI API does
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(arguments, dict):
            out.append(ToolCallError(f"the arguments of {value['name']!r} must be a JSON object"))
            continue
        out.append(ToolCall(value["name"], arguments))
    return out


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as a model writes it (for demonstrations)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def describe_tools(tools: dict[str, Callable[..., Any]]) -> str:
    """The tools' names, signatures and docstrings, for the system prompt."""
    lines = []
    for name, fn in tools.items():
        params = ", ".join(inspect.signature(fn).parameters)
        lines.append(f"- {name}({params}): {(inspect.getdoc(fn) or '').splitlines()[0] if inspect.getdoc(fn) else ''}")
    return "\n".join(lines)


class ToolEnvironment:
    """An Environment of tools (`tools`: name -> function) around a task; subclasses give `tools` and `score`."""

    tools: dict[str, Callable[..., Any]] = {}
    system_prompt = ""  # '' = none; "{tools}" in it is replaced by describe_tools(tools)

    def __init__(self, max_tool_calls: int = 8) -> None:
        self.max_tool_calls = max_tool_calls  # per episode; calls past it are answered with an error
        self.task: Example | None = None
        self.calls = 0

    def reset(self, task: Example) -> list[Message]:
        self.task, self.calls = task, 0
        system = self.system_prompt.replace("{tools}", describe_tools(self.tools))
        return prompt_messages(task, system)

    def step(self, action: str) -> Step:
        calls = parse_tool_calls(action)
        if not calls:
            assert self.task is not None, "step() before reset()"
            return Step([], reward=float(self.score(action, self.task)), done=True)
        observation, failures = [], 0
        for call in calls:
            result, failed = self._run(call)
            failures += failed
            observation.append({"role": "tool", "content": result[:MAX_RESULT_CHARS]})
        return Step(observation, tool_calls=len(calls), tool_failures=failures)

    def _run(self, call: ToolCall | ToolCallError) -> tuple[str, bool]:
        """(the result's text, whether the call failed)."""
        self.calls += 1
        if isinstance(call, ToolCallError):
            return f"error: {call}", True
        if self.calls > self.max_tool_calls:
            return f"error: no more than {self.max_tool_calls} tool calls per episode", True
        fn = self.tools.get(call.name)
        if fn is None:
            return f"error: no tool {call.name!r}; the tools are {', '.join(self.tools)}", True
        try:
            inspect.signature(fn).bind(**call.arguments)
        except TypeError as err:
            return f"error: {call.name}: {err}", True
        try:
            return str(fn(**call.arguments)), False
        except Exception as err:  # noqa: BLE001 - the tool's failure is the model's observation
            return f"error: {call.name}: {type(err).__name__}: {err}", True

    def score(self, answer: str, task: Example) -> float:
        """The reward of the model's final answer (a turn with no tool call)."""
        raise NotImplementedError
