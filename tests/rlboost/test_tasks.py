"""Tests of rlboost.tasks: the seeded addition task, its resumable batch order, rewards and their loader."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.spec import TaskSpec
from rlboost.tasks import Example, make_task
from rlboost.tasks.rewards import exact_match, format_reward, math_answer, parse_number


def test_addition_examples_are_seeded_and_correct() -> None:
    spec = TaskSpec(max_operand=7, num_prompts=50, seed=3)
    task = make_task(spec)
    assert len(task.examples) == 50
    assert task.examples == make_task(spec).examples
    assert task.examples != make_task(spec.model_copy(update={"seed": 4})).examples
    for ex in task.examples:
        a, b = ex.question.removeprefix("What is ").removesuffix("?").split("+")
        assert 0 <= int(a) <= 7 and 0 <= int(b) <= 7
        assert ex.answer == str(int(a) + int(b))


def test_example_is_frozen() -> None:
    ex = Example("What is 1+2?", "3")
    with pytest.raises(AttributeError):
        ex.answer = "4"  # type: ignore[misc]


def test_batch_is_a_function_of_seed_and_step() -> None:
    spec = TaskSpec(num_prompts=10, seed=5)
    task, again = make_task(spec), make_task(spec)
    assert task.batch(7, 4) == again.batch(7, 4)  # resumable from the step number alone
    for idx, ex in task.batch(3, 4):
        assert task.examples[idx] == ex


def test_batch_visits_every_example_once_per_epoch() -> None:
    task = make_task(TaskSpec(num_prompts=12, seed=1))
    epoch0 = [i for step in range(3) for i, _ in task.batch(step, 4)]
    epoch1 = [i for step in range(3, 6) for i, _ in task.batch(step, 4)]
    assert sorted(epoch0) == list(range(12)) == sorted(epoch1)
    assert epoch0 != epoch1  # each epoch is reshuffled


def test_batch_crosses_epoch_boundaries() -> None:
    task = make_task(TaskSpec(num_prompts=5, seed=2))
    flat = [i for step in range(4) for i, _ in task.batch(step, 3)]  # 12 = 2 epochs + 2
    assert sorted(flat[:5]) == sorted(flat[5:10]) == list(range(5))
    with pytest.raises(ValueError, match="step"):
        task.batch(-1, 3)


def test_messages_are_a_single_user_turn() -> None:
    task = make_task(TaskSpec(num_prompts=2))
    ex = task.examples[0]
    assert task.messages(ex) == [{"role": "user", "content": ex.question}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", 1.0),
        ("  12\n", 1.0),
        ("12<|im_end|>", 1.0),
        ("12<|im_end|>\n<|im_start|>user", 1.0),
        ("12<|endoftext|>", 1.0),
        ("", 0.0),
        ("1 2", 0.0),
        ("12.", 0.0),
        ("012", 0.0),
        ("13", 0.0),
        ("the answer is 12", 0.0),
        ("<|im_end|>12", 0.0),
    ],
)
def test_exact_match(text: str, expected: float) -> None:
    assert exact_match(text, Example("What is 5+7?", "12")) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("7", 1.0), ("-3 ", 1.0), ("42<|im_end|>", 1.0), ("", 0.0), ("4 2", 0.0), ("x", 0.0), ("4.0", 0.0)],
)
def test_format_reward(text: str, expected: float) -> None:
    assert format_reward(text, Example("What is 5+7?", "12")) == expected


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        ("The answer is 12.", "12", 1.0),
        ("5 + 7 = 12, so the answer is 12<|im_end|>", "12", 1.0),
        ("First 3, then 4, finally \\boxed{12}. Check: 13 is wrong", "12", 1.0),  # a box beats a later number
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("$\\dfrac{6}{8}$", "3/4", 1.0),
        ("Half of it: \\boxed{x = -\\frac{1}{2}}", "-0.5", 1.0),
        ("work...\n#### 1,234", "1234", 1.0),
        ("The final answer is: $+7$.", "7", 1.0),
        ("It costs \\$1,000", "1000", 1.0),
        ("The answer is 5 because 2 + 2 = 4", "5", 1.0),  # the number right after "answer is"
        ("\u22125", "-5", 1.0),  # a Unicode minus
        ("we get 7.50", "7.5", 1.0),
        ("\\boxed{5 \\text{ cm}}", "5", 1.0),
        ("Answer: Paris.", "paris", 1.0),  # a non-numeric reference answer: normalised text
        # Tricky negatives.
        ("", "12", 0.0),
        ("no digits here", "12", 0.0),
        ("The answer is 13.", "12", 0.0),
        ("123", "12", 0.0),  # a prefix is not the number
        ("5-3", "-3", 0.0),  # a binary minus is no sign
        ("-5", "5", 0.0),
        ("0.7499", "3/4", 0.0),
        ("1/0", "1", 0.0),
        ("1,23", "123", 0.0),  # not a thousands separator: the last number is 23
        ("\\boxed{13}, or maybe 12", "12", 0.0),  # the box is the answer
        ("9" * 50_000, "9" * 50_000, 0.0),  # too long to be an answer, never fed to Fraction
        ("<|im_end|>12", "12", 0.0),  # after the end-of-turn marker nothing counts
        ("Answer: London.", "paris", 0.0),
    ],
)
def test_math_answer(text: str, answer: str, expected: float) -> None:
    assert math_answer(text, Example("q", answer)) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-2.50", Fraction(-5, 2)),
        ("1,000,000", 10**6),
        ("$+.5$.", Fraction(1, 2)),
        ("x", None),
        ("1/0", None),
        ("1,0000", None),
        ("2**10", None),
        ("1e5", None),
    ],
)
def test_parse_number_is_exact_and_evaluates_nothing(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def _spellings(value: Fraction) -> list[str]:
    """Equivalent ways to write `value` (a multiple of 1/8, so every one has a finite decimal)."""
    sign = "-" if value < 0 else ""
    mag = abs(value)
    dec = f"{sign}{float(mag):.3f}"  # exact: a multiple of 1/8 below 2**53
    latex = f"{sign}\\frac{{{mag.numerator * 2}}}{{{mag.denominator * 2}}}"
    forms = [dec, f"{dec}0", f"{sign}{mag.numerator}/{mag.denominator}", latex]
    if mag.denominator == 1:
        whole = int(mag)
        forms += [f"{sign}{whole}", f"{sign}{whole:,}", f"{sign or '+'}{whole}"]
    return forms


_WRAPPERS = ["{}", "The answer is {}.", "so\n#### {}", "\\boxed{{{}}}", "I think it is ${}$"]


@given(
    st.integers(-(10**9), 10**9),
    st.sampled_from([1, 2, 4, 8]),
    st.integers(0, 4),
    st.data(),
)
def test_math_answer_property(num: int, den: int, wrapper: int, data: st.DataObject) -> None:
    """Any equivalent spelling in any wrapper verifies; a different number never does."""
    value = Fraction(num, den)
    reference = str(num // den) if value.denominator == 1 else f"{float(value)}"
    form = data.draw(st.sampled_from(_spellings(value)))
    text = _WRAPPERS[wrapper].format(form)
    assert math_answer(text, Example("q", reference)) == 1.0, text
    delta = data.draw(st.sampled_from([Fraction(1), Fraction(-1), Fraction(1, 8), Fraction(1000)]))
    other = data.draw(st.sampled_from(_spellings(value + delta)))
    wrong = _WRAPPERS[wrapper].format(other)
    assert math_answer(wrong, Example("q", reference)) == 0.0, wrong
