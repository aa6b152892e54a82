"""The pass@k estimator (Codex paper), the summary of an evaluation, the addition task's validation prompts and
the spec's evaluation fields."""

from __future__ import annotations

from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost.evaluation import ScoredResponse, pass_at_k, summarize
from rlboost.spec import JobSpecError, parse_job_spec
from rlboost.tasks.base import make_task
from rlboost.tasks.validation import AdditionValidation, ValidationSource, validation_source


@st.composite
def n_c_k(draw: st.DrawFn) -> tuple[int, int, int]:
    n = draw(st.integers(1, 200))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(n_c_k())
def test_pass_at_k_is_the_exact_combinatorial_estimate(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


@given(n_c_k())
def test_pass_at_k_grows_with_k_and_with_c_and_stays_a_probability(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    value = pass_at_k(n, c, k)
    assert 0.0 <= value <= 1.0
    if k < n:
        assert pass_at_k(n, c, k + 1) >= value - 1e-12
    if c < n:
        assert pass_at_k(n, c + 1, k) >= value - 1e-12


@given(st.integers(1, 500), st.data())
def test_pass_at_1_is_the_fraction_passing_and_the_ends_are_exact(n: int, data: st.DataObject) -> None:
    c = data.draw(st.integers(0, n))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    k = data.draw(st.integers(1, n))
    assert pass_at_k(n, 0, k) == 0.0
    assert pass_at_k(n, n, k) == 1.0
    assert pass_at_k(n, c, n) == (1.0 if c else 0.0)  # all drawn: any pass


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_summarize_averages_over_prompts_with_the_threshold() -> None:
    groups = [
        [ScoredResponse(1.1, 4), ScoredResponse(0.1, 6)],  # one of two passes (reward >= 1.0)
        [ScoredResponse(0.0, 2, failed=True), ScoredResponse(0.1, 4)],  # none
    ]
    report = summarize(3, 4, groups, k=2, threshold=1.0, seconds=0.5)
    assert (report.step, report.weight_version, report.k, report.prompts) == (3, 4, 2, 2)
    assert report.reward_mean == pytest.approx(1.3 / 4)
    assert report.pass_at_1 == pytest.approx(0.25)
    assert report.pass_at_k == pytest.approx(0.5)
    assert report.response_tokens_mean == 4.0
    assert report.reward_failures == 1


def test_the_addition_validation_set_is_seeded_and_apart_from_the_training_order() -> None:
    spec = parse_job_spec({"task": {"maxOperand": 1000, "seed": 7}})
    source: ValidationSource = validation_source(spec)
    assert isinstance(source, AdditionValidation)
    first = source.validation_examples(50)
    assert first == validation_source(spec).validation_examples(50)  # same prompts at every evaluation
    assert first[:10] == source.validation_examples(10)
    assert all(int(e.answer) == sum(map(int, e.question[8:-1].split("+"))) for e in first)
    training = [ex for _, ex in make_task(spec.task).batch(0, 50)]
    assert first != training
    other = validation_source(parse_job_spec({"task": {"maxOperand": 1000, "seed": 8}}))
    assert other.validation_examples(50) != first


def test_evaluation_fields_are_checked_with_the_field_named() -> None:
    spec = parse_job_spec({"evaluation": {"everySteps": 5, "samples": 8, "temperature": 0.7}})
    assert (spec.evaluation.every_steps, spec.evaluation.samples, spec.evaluation.temperature) == (5, 8, 0.7)
    assert parse_job_spec({}).evaluation.every_steps == 0  # off unless asked for
    cases = [
        ({"evaluation": {"temperature": 0, "samples": 4}}, "evaluation.samples", "greedy"),
        ({"evaluation": {"samples": 0}}, "evaluation.samples", "greater than or equal to 1"),
        ({"evaluation": {"everySteps": -1}}, "evaluation.everySteps", "greater than or equal to 0"),
        (
            {"evaluation": {"everySteps": 1, "prompts": 100, "samples": 8}, "rollout": {"maxStepRequests": 512}},
            "evaluation.prompts",
            "exceeds rollout.maxStepRequests",
        ),
    ]
    for data, path, words in cases:
        with pytest.raises(JobSpecError) as err:
            parse_job_spec(data)
        assert err.value.problems[0].path == path
        assert words in err.value.problems[0].message


def test_the_local_report_and_display_carry_the_evaluations(tmp_path) -> None:
    import io
    import json

    from rich.console import Console

    from rlboost.local.progress import ProgressState, render, step_line
    from rlboost.local.report import LocalReport, write_report
    from rlboost.wire.events import StepReport

    v = summarize(1, 2, [[ScoredResponse(1.0, 3), ScoredResponse(0.0, 5)]], k=2, threshold=1.0, seconds=0.1)
    steps = [
        StepReport(
            step=i,
            reward_mean=0.5,
            tokens=8,
            rollout_seconds=1,
            train_seconds=1,
            sync_seconds=1,
            weight_version=i + 1,
            weights_checksum="c",
            validation=v if i == 1 else None,
        )
        for i in (0, 1)
    ]
    write_report(LocalReport(steps=steps, validation=[v]), tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert [
        {key: e[key] for key in ("step", "reward_mean", "pass_at_1", "pass_at_k", "k")} for e in data["validation"]
    ] == [{"step": 1, "reward_mean": 0.5, "pass_at_1": 0.5, "pass_at_k": 1.0, "k": 2}]
    assert "validation" not in step_line(steps[0], 2)
    assert "pass@1 0.500  pass@2 1.000" in step_line(steps[1], 2)
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(render(ProgressState(total_steps=2, steps=steps)))
    assert "validation after step 1" in console.export_text()
