"""The built-in `calculator` environment: arithmetic questions the model answers with a calculator tool.

    task:
      name: multiplication            # "What is 47*83?" (or any dataset of questions with numeric answers)
      environment: {name: calculator}

The model calls `calculator(expression)` (a tool call, see rlboost.environments.tools), reads the result, and
answers with the number alone; the reward is 1.0 when that answer equals the task's, else 0.0. The tool
evaluates +, -, *, / and parentheses on numbers only (a small parser of its own: nothing is compiled or executed). `demonstration(task)` is the
ideal episode, which the tiny model's warm-up learns the format from.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlboost.environments.base import Message
from rlboost.environments.tools import ToolEnvironment, tool_call_text
from rlboost.tasks.base import Example, prompt_messages
from rlboost.tasks.rewards import final_text

_MAX_EXPRESSION = 200
_MAX_MAGNITUDE = 10**30
_QUESTION = re.compile(r"What is (.+)\?")
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")


class _Parser:
    """expression := term (('+' | '-') term)*; term := factor (('*' | '/') factor)*;
    factor := ('+' | '-') factor | number | '(' expression ')'. Exact arithmetic (Fractions); nothing compiled."""

    def __init__(self, text: str) -> None:
        self.tokens = [m.group(1) or m.group(2) for m in _TOKEN.finditer(text) if m.group(1) or m.group(2)]
        self.pos = 0

    def parse(self) -> Fraction:
        value = self._expression()
        if self.pos != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.pos]!r}")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("the expression ends too early")
        self.pos += 1
        return token

    def _expression(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            value = _bounded(value + self._term() if self._take() == "+" else value - self._term())
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            op, right = self._take(), self._factor()
            if op == "/" and right == 0:
                raise ZeroDivisionError("division by zero")
            value = _bounded(value * right if op == "*" else value / right)
        return value

    def _factor(self) -> Fraction:
        token = self._take()
        if token in ("+", "-"):
            value = self._factor()
            return -value if token == "-" else value
        if token == "(":
            value = self._expression()
            if self._take() != ")":
                raise ValueError("a '(' is not closed")
            return value
        if token[0].isdigit():
            return Fraction(token)
        raise ValueError(f"unexpected {token!r}: only numbers, + - * / and parentheses")


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > _MAX_MAGNITUDE:
        raise ValueError("the result is too large")
    return value


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / and parentheses)."""
    if not isinstance(expression, str) or len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression must be text of at most {_MAX_EXPRESSION} characters")
    value = _Parser(expression).parse()
    return str(value.numerator) if value.denominator == 1 else str(float(value))


class CalculatorEnv(ToolEnvironment):
    """Arithmetic questions answered with a calculator tool; reward 1.0 for the exact answer."""

    tools = {"calculator": calculate}

    def __init__(self, max_tool_calls: int = 4, system_prompt: str = "") -> None:
        super().__init__(max_tool_calls)
        self.system_prompt = system_prompt  # '' = none (the tiny model learns the format from its warm-up)

    def score(self, answer: str, task: Example) -> float:
        return 1.0 if final_text(answer) == task.answer.strip() else 0.0

    def demonstration(self, task: Example) -> list[Message]:
        """The ideal episode: the question, one calculator call, its result, the answer."""
        match = _QUESTION.search(task.question)
        expression = match.group(1) if match else task.question
        call = tool_call_text("calculator", {"expression": expression})
        return [
            *prompt_messages(task, self.system_prompt),
            {"role": "assistant", "content": call},
            {"role": "tool", "content": calculate(expression)},
            {"role": "assistant", "content": task.answer},
        ]
