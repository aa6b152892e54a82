"""The built-in verifiers (math_verify, regex_match, format) in process and in the real reward sandbox, and the
weighted sum of several rewards that `task.reward` may name."""

from __future__ import annotations

import ast

import pytest

from rlboost.reward_registry import reward_terms
from rlboost.spec import JobSpecError, RewardTerm, parse_job_spec
from rlboost.tasks.base import Example
from rlboost.tasks.sandbox import RewardSandbox, RewardSandboxError, SandboxLimits
from rlboost.tasks.sandbox_child import _safe_sympy_text
from rlboost.tasks.verifiers import answer_format, math_verify, regex_match


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("The answer is \\boxed{1/2}", "0.5", 1.0),
        ("so we get \\boxed{0.5}.", "\\frac{1}{2}", 1.0),
        ("$\\frac{3}{4}$", "0.75", 1.0),
        ("12", "12", 1.0),
        ("x = \\boxed{4}", "3", 0.0),
        ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0),  # sets compare as sets
        ("The result is $2\\sqrt{2}$", "\\sqrt{8}", 1.0),
        ("no answer here", "7", 0.0),
        ("\\boxed{7}<|im_end|>\\boxed{8}", "7", 1.0),  # what follows the end-of-turn marker is not read
    ],
)
def test_math_verify_compares_answers_mathematically(response: str, answer: str, expected: float) -> None:
    assert math_verify(response, Example("q", answer)) == expected


def test_regex_match_searches_or_matches_the_whole_response_and_knows_the_answer() -> None:
    ex = Example("q", "42")
    assert regex_match("the answer: 42.", ex, pattern=r"answer: {answer}\b") == 1.0
    assert regex_match("the answer: 421", ex, pattern=r"answer: {answer}\b") == 0.0
    assert regex_match("42 and more", ex, pattern=r"\d+", full=True) == 0.0
    assert regex_match(" 42 <|im_end|>", ex, pattern=r"\d+", full=True) == 1.0


@pytest.mark.parametrize(
    ("style", "good", "bad"),
    [
        ("boxed", "so \\boxed{3}.", "so 3."),
        ("answer_tag", "thinking... <answer>3</answer>", "<answer>3</answer> and more"),
        ("think_answer", "<think>1+2</think> <answer>3</answer>", "<answer>3</answer>"),
        ("integer", " -3 ", "3.5"),
    ],
)
def test_format_checks_the_required_answer_format(style: str, good: str, bad: str) -> None:
    ex = Example("q", "3")
    assert answer_format(good, ex, style=style) == 1.0
    assert answer_format(bad, ex, style=style) == 0.0


def test_format_refuses_an_unknown_style() -> None:
    with pytest.raises(ValueError, match="params.style 'xml' is not one of boxed"):
        answer_format("x", Example("q", "3"), style="xml")


def test_a_weighted_list_is_validated_term_by_term_with_the_field_named() -> None:
    spec = parse_job_spec({"task": {"reward": [{"name": "math_verify"}, {"name": "format", "weight": 0.1}]}})
    assert reward_terms(spec.task.reward) == [("math_verify", 1.0, {}), ("format", 0.1, {})]
    assert reward_terms("exact_match") == [("exact_match", 1.0, {})]
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({"task": {"reward": [{"name": "math_verify"}, {"name": "no_such"}]}})
    assert err.value.problems[0].path == "task.reward.1.name"
    assert "not a registered reward" in err.value.problems[0].message
    for bad, path in (
        (7, "task.reward"),
        ([], "task.reward"),
        ([{"name": "format", "weight": 1e9}], "task.reward.0.weight"),
    ):
        with pytest.raises(JobSpecError) as err:
            parse_job_spec({"task": {"reward": bad}})
        assert err.value.problems[0].path == path


def test_the_sandbox_sums_weighted_terms_with_their_params() -> None:
    terms = [
        RewardTerm(name="math_verify", weight=1.0),
        RewardTerm(name="format", weight=0.25, params={"style": "boxed"}),
        RewardTerm(name="regex_match", weight=-0.5, params={"pattern": "sorry"}),
    ]
    half = Example("q", "0.5")
    samples = [("\\boxed{1/2}", half), ("1/2", half), ("\\boxed{3}", half), ("sorry, 0.5", half)]
    with RewardSandbox(terms, SandboxLimits(processes=1)) as sandbox:
        results = sandbox.score(samples)
    assert [r.failure for r in results] == [None] * 4
    assert [r.value for r in results] == [1.25, 1.0, 0.25, 0.5]


def test_math_verify_runs_in_the_sandbox_as_in_process() -> None:
    """SymPy's parse_expr evaluates generated text; the sandbox lets exactly its number literals through."""
    samples = [("\\boxed{1/2}", Example("q", "0.5")), ("x=\\boxed{4}", Example("q", "3")), ("7", Example("q", "7"))]
    with RewardSandbox("math_verify", SandboxLimits(processes=1)) as sandbox:
        results = sandbox.score(samples)
    assert [(r.value, r.failure) for r in results] == [(1.0, None), (0.0, None), (1.0, None)]


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("Integer (12 )", True),
        ("Float ('0.5' )", True),
        ("Integer (1 )/Integer (2 )", True),
        ("from sympy import *", True),
        (
            "Add(Mul(-Integer(3), Pow(Integer(4), -1, evaluate=False), evaluate=False), Integer(2), evaluate=False)",
            True,
        ),
        (ast.parse("Pow(Integer(2), Integer(10), evaluate=False)", mode="eval"), True),
        (ast.parse("__import__('os')", mode="eval"), False),
        ("Integer(1)(evaluate=__builtins__)", False),
        ("1 + 1", False),  # no SymPy constructor: not what parse_expr generates
        ("__import__('os').system('id')", False),
        ("Integer (1 ).__class__", False),
        ("Integer (1 )[0]", False),
        ("from os import *", False),
    ],
)
def test_only_sympy_number_literals_pass_the_audit_hook(text: str | ast.AST, safe: bool) -> None:
    assert _safe_sympy_text(text) is safe


def test_params_that_do_not_fit_the_reward_fail_the_start_naming_task_reward() -> None:
    bad = [RewardTerm(name="exact_match", params={"pattern": "x"})]
    with pytest.raises(RewardSandboxError, match="task.reward 'exact_match': params \\['pattern'\\] do not fit"):
        RewardSandbox(bad, SandboxLimits(processes=1)).start()


@pytest.mark.parametrize(
    ("term", "words"),
    [
        (RewardTerm(name="regex_match"), "missing a required argument: 'pattern'"),
        (RewardTerm(name="regex_match", params={"pattern": "(unclosed"}), "is not a regular expression"),
        (RewardTerm(name="format", params={"style": "xml"}), "params.style 'xml' is not one of boxed"),
    ],
)
def test_a_builtins_bad_params_fail_the_start_clearly(term: RewardTerm, words: str) -> None:
    with pytest.raises(RewardSandboxError, match="task.reward") as err:
        RewardSandbox([term], SandboxLimits(processes=1)).start()
    assert words in str(err.value)
