"""The built-in reward functions `(response_text, example) -> float`.

A job names its reward in `task.reward` by entry point name (group `rlboost.rewards`, see rlboost.reward_registry);
these are registered there as `exact_match` (the answer, nothing else), `format_reward` (just an integer) and
`math_answer`. Rewards run in the reward sandbox (rlboost.tasks.sandbox), never in the trainer's process.

`math_answer` verifies free-form solutions. The final answer is taken from, in order of precedence: the last
`\\boxed{...}` (or `\\fbox{...}`), the text after the last `####`, the text after the last "answer is" /
"answer:", else the last number in the response. It is compared with `example.answer` as an exact rational:
integers, decimals, fractions `3/4` and `\\frac{3}{4}` (`\\dfrac`, `\\tfrac`) are equal when their values are
(3/4 == 0.75 == \\frac{6}{8}); thousands separators (`1,234`), a leading `+`, a Unicode minus, surrounding
`$` / `\\(...\\)`, LaTeX spacing (`\\,`, `\\!`) and a trailing period are ignored. An answer that is not a number
is compared as normalised text. Nothing is evaluated: parsing is regular expressions and `fractions.Fraction`
on at most `_MAX_NUMBER_CHARS` characters (a huge number is no answer), and only the last `_MAX_RESPONSE_CHARS`
characters of a response are read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from rlboost.tasks.base import Example

RewardFn = Callable[[str, Example], float]

# End-of-turn markers a decoder may leave in the text; everything from the first one on is ignored.
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")
_INTEGER = re.compile(r"-?\d+")


def final_text(response_text: str) -> str:
    cut = len(response_text)
    for marker in _END_MARKERS:
        i = response_text.find(marker)
        if i != -1:
            cut = min(cut, i)
    return response_text[:cut].strip()


def exact_match(response_text: str, example: Example) -> float:
    """1.0 when the response (stripped, up to an end-of-turn marker) equals the answer, else 0.0."""
    return 1.0 if final_text(response_text) == example.answer.strip() else 0.0


def format_reward(response_text: str, example: Example) -> float:
    """1.0 when the response (stripped, up to an end-of-turn marker) is only an integer, else 0.0."""
    return 1.0 if _INTEGER.fullmatch(final_text(response_text)) else 0.0


_MAX_RESPONSE_CHARS = 20_000  # only the tail of a response is read: the answer comes last
_MAX_NUMBER_CHARS = 64  # longer candidates are no answer (and Fraction never sees a 10^6-digit string)
_PLAIN = re.compile(r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)")
_SLASH = re.compile(r"([^/]+)/([^/]+)")
_LATEX_FRAC = re.compile(r"([-+]?)\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
# A number in running text: a LaTeX fraction, or digits with an optional fraction bar; a sign counts only
# where it cannot be a binary minus (so "5-3" ends in 3, not -3).
_IN_TEXT = re.compile(
    r"(?:(?<![\w)\]}])[-+])?\\[dt]?frac\{[^{}]+\}\{[^{}]+\}"
    r"|(?:(?<![\w)\]}.])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?"
    r"|(?:(?<![\w)\]}.])[-+])?\.\d+"
)
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)\s*:?\s*", re.IGNORECASE)
_NOISE = re.compile(r"\\[,!;: ]|\\left|\\right|\s+")


def _unwrap(text: str) -> str:
    """Strip what surrounds a final answer: whitespace, $ / \\( \\) / \\[ \\] delimiters, a trailing period."""
    text = text.replace("\u2212", "-")
    prev = None
    while prev != text:
        prev = text
        text = text.strip().rstrip(".").strip()
        for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("\\$", ""), ("$", "")):
            if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right) - 1:
                text = text[len(left) : len(text) - len(right)] if right else text[len(left) :]
        text = text.removesuffix("$")
    return text


def _plain_number(text: str) -> Fraction | None:
    if not _PLAIN.fullmatch(text):
        return None
    return Fraction(text.replace(",", ""))


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number written as an integer, decimal, a/b or \\frac{a}{b}; None otherwise."""
    text = _NOISE.sub("", _unwrap(text))
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    if (m := _LATEX_FRAC.fullmatch(text)) or (m := _SLASH.fullmatch(text)):
        sign, num, den = (m.group(1), m.group(2), m.group(3)) if m.re is _LATEX_FRAC else ("", *m.groups())
        a, b = _plain_number(num), _plain_number(den)
        if a is None or b is None or b == 0:
            return None
        return -a / b if sign == "-" else a / b
    return _plain_number(text)


def _boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} / \\fbox{...} (balanced braces), or None."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unbalanced: not a usable box


def extract_answer(response_text: str) -> str | None:
    """The final answer of a free-form response (see the module docstring for the precedence), or None."""
    text = final_text(response_text)[-_MAX_RESPONSE_CHARS:].replace("\u2212", "-")
    boxed = _boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.split("=")[-1].strip()  # "x = 5" -> "5"
    for found in (_after(text, "####"), _after_answer_is(text)):
        if found is not None and found.strip():
            if parse_number(found) is not None:
                return found.strip()
            first = _IN_TEXT.search(found)  # "answer is 5 because 2+2=4": the first number is the answer
            return first.group(0) if first else found.strip()
    numbers = list(_IN_TEXT.finditer(text))
    return numbers[-1].group(0) if numbers else None


def _after(text: str, marker: str) -> str | None:
    i = text.rfind(marker)
    return text[i + len(marker) :].strip().splitlines()[0] if i >= 0 and text[i + len(marker) :].strip() else None


def _after_answer_is(text: str) -> str | None:
    found = list(_ANSWER_IS.finditer(text))
    if not found:
        return None
    rest = text[found[-1].end() :].strip()
    return re.split(r"\.\s|\n", rest, maxsplit=1)[0] if rest else None


def _normal_text(text: str) -> str:
    return " ".join(_unwrap(text).split()).lower()


def math_answer(response_text: str, example: Example) -> float:
    """1.0 when the response's final answer equals `example.answer` mathematically (exact rationals), else 0.0."""
    candidate = extract_answer(response_text)
    if candidate is None:
        return 0.0
    target = parse_number(example.answer)
    if target is None:  # a non-numeric reference answer: compare normalised text
        return 1.0 if _normal_text(candidate) == _normal_text(example.answer) else 0.0
    got = parse_number(candidate)
    if got is None:  # \\boxed{5 \\text{ cm}}: the box's last number
        numbers = list(_IN_TEXT.finditer(candidate))
        got = parse_number(numbers[-1].group(0)) if numbers else None
    return 1.0 if got is not None and got == target else 0.0
