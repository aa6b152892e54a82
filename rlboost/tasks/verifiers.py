"""Built-in verifiers `(response_text, example, **params) -> float`: math answers, regex matches, answer formats.

Registered in the group `rlboost.rewards` (rlboost.reward_registry) as `math_verify`, `regex_match` and `format`;
`exact_match` stays in rlboost.tasks.rewards. A job passes a verifier's keyword parameters in the spec:
`task.reward: [{name: regex_match, params: {pattern: '\\d+'}}]`. Each gets the response text, the example (its
reference `answer` and its per-row `metadata`) and those parameters; it runs in the reward sandbox
(rlboost.tasks.sandbox), never in the trainer's process.

`math_verify` is Hugging Face's math-verify: the reference and the response are parsed (LaTeX, `\\boxed{}`,
plain expressions) into SymPy and compared mathematically (1/2 == 0.5 == \\frac{1}{2}, sets, intervals,
equations). math-verify reaches SymPy's `parse_expr`, which evaluates generated Python text: the sandbox allows
exactly the number literals it generates there (rlboost.tasks.sandbox_child._safe_sympy_text). Its own 5 s
timeouts are off: they returned False, a real-looking zero, for text such as `9^{9^{9^9}}`; the sandbox's per-call
limit (task.rewardTimeoutSeconds) ends such a call instead, counted as the failure kind 'timeout' (issue 31).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import math_verify.grader
import math_verify.parser
from math_verify import parse, verify

from rlboost.tasks.base import Example
from rlboost.tasks.rewards import final_text

_MAX_RESPONSE_CHARS = 20_000  # the answer comes last: only the tail of a long response is parsed
# The sandbox times each call (see the module docstring): math-verify's warning that its own timeout is off is noise.
math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
# A named answer format for `format`: the whole response (up to an end-of-turn marker) must match it.
ANSWER_FORMATS: dict[str, str] = {
    "boxed": r"(?s).*\\boxed\{.+\}.*",
    "answer_tag": r"(?s).*<answer>.+?</answer>\s*",
    "think_answer": r"(?s)\s*<think>.+?</think>\s*<answer>.+?</answer>\s*",
    "integer": r"\s*-?\d+\s*",
}


@lru_cache(maxsize=4096)
def _parsed_reference(answer: str) -> Any:
    """The reference parsed once per distinct answer (a step scores group_size responses against each). A bare
    LaTeX answer ('\\frac{1}{2}') gets the $ delimiters math-verify's LaTeX extraction looks for."""
    return parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=None)


def math_verify(response_text: str, example: Example) -> float:
    """1.0 when math-verify finds the response's final answer equal to `example.answer`, else 0.0."""
    gold = _parsed_reference(example.answer)
    if not gold:
        return 0.0
    answer = parse(final_text(response_text)[-_MAX_RESPONSE_CHARS:], parsing_timeout=None)
    return 1.0 if answer and verify(gold, answer, timeout_seconds=None) else 0.0


def _warm_up_math_verify() -> None:
    """Run each kind of answer once: SymPy and mpmath generate some of their code on first use (exec of
    library templates), which the sandbox allows only while the reward loads, before its audit hook."""
    for response, answer in _WARM_UP:
        math_verify(response, Example("", answer))


_WARM_UP = [
    ("\\boxed{1/2}", "0.5"),
    ("$\\frac{3}{4}$", "0.75"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("x = 5", "5"),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}"),
    ("\\boxed{(0, 1]}", "(0, 1]"),
    ("\\boxed{x^2+1}", "1+x^2"),
    ("\\boxed{10\\%}", "0.1"),
    ("\\boxed{\\pi/2}", "1.5708"),
    ("\\boxed{1e3}", "1000"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\boxed{A}", "A"),
]
math_verify.warm_up = _warm_up_math_verify  # type: ignore[attr-defined]  # called by the sandbox at load


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def regex_match(response_text: str, example: Example, pattern: str, full: bool = False) -> float:
    """1.0 when `pattern` (a Python regular expression; `{answer}` in it stands for the escaped reference answer)
    is found in the response (`full`: matches the whole response, stripped, up to an end-of-turn marker)."""
    regex = _compiled(pattern.replace("{answer}", re.escape(example.answer.strip())))
    text = final_text(response_text)
    found = regex.fullmatch(text) if full else regex.search(text)
    return 1.0 if found else 0.0


def _check_regex_params(pattern: str, full: bool = False) -> None:
    try:
        _compiled(pattern.replace("{answer}", "0"))
    except re.error as err:
        raise ValueError(f"regex_match: params.pattern {pattern!r} is not a regular expression: {err}") from None


regex_match.check_params = _check_regex_params  # type: ignore[attr-defined]  # called by the sandbox at load


def answer_format(response_text: str, example: Example, style: str = "boxed") -> float:
    """1.0 when the response has the required answer format `style` (ANSWER_FORMATS: boxed, answer_tag,
    think_answer, integer), else 0.0; the answer's correctness is not judged."""
    _check_format_params(style)
    return 1.0 if _compiled(ANSWER_FORMATS[style]).fullmatch(final_text(response_text)) else 0.0


def _check_format_params(style: str = "boxed") -> None:
    if style not in ANSWER_FORMATS:
        raise ValueError(f"format: params.style {style!r} is not one of {', '.join(ANSWER_FORMATS)}")


answer_format.check_params = _check_format_params  # type: ignore[attr-defined]  # called by the sandbox at load
