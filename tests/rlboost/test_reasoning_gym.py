"""reasoning-gym's procedural tasks as a dataset source (task.dataset.reasoningGym): the spec's fields and refusals,
tasks generated deterministically by seed with their own answers, scored by reasoning-gym's score_answer inside the
real reward sandbox (rlboost.tasks.sandbox), and an unknown name refused before the first step naming the field."""

from __future__ import annotations

import pytest

from rlboost.local.runner import LocalRunError, check_local_dataset
from rlboost.spec import JobSpec, JobSpecError, ReasoningGymSpec, TaskSpec, parse_job_spec
from rlboost.tasks.base import Example
from rlboost.tasks.dataset import generated_task
from rlboost.tasks.reasoning_gym import ReasoningGymError, reasoning_gym_examples
from rlboost.tasks.sandbox import RewardSandbox, SandboxLimits

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def _task(**rg) -> TaskSpec:
    return TaskSpec.model_validate({"dataset": {"reasoningGym": {"name": "basic_arithmetic", **rg}}})


def test_the_spec_names_a_generator_and_scores_with_it_by_default():
    task = _task(size=5, seed=3)
    assert task.reward == "reasoning_gym" and task.active_dataset is None
    assert (
        TaskSpec.model_validate({"dataset": {"reasoningGym": {"name": "chain_sum"}}, "reward": "exact_match"}).reward
        == "exact_match"
    )  # an explicit reward stays
    with pytest.raises(JobSpecError, match=r"task\.dataset\.reasoningGym: .*unset the other"):
        parse_job_spec({"task": {"dataset": {"train": "x.jsonl", "reasoningGym": {"name": "chain_sum"}}}})
    for bad in ({"name": "Bad Name"}, {"name": "chain_sum", "size": 0}, {"name": "gcd", "config": {"seed": 1}}):
        with pytest.raises(JobSpecError, match=r"task\.dataset\.reasoningGym\.(name|size|config)"):
            parse_job_spec({"task": {"dataset": {"reasoningGym": bad}}})


def test_tasks_are_generated_from_the_seed_with_their_answers():
    spec = ReasoningGymSpec(name="basic_arithmetic", size=6, seed=11, config=SMALL)
    first, again = reasoning_gym_examples(spec), reasoning_gym_examples(spec)
    other = reasoning_gym_examples(spec.model_copy(update={"seed": 12}))
    assert first == again and first != other and len(first) == 6
    assert all(e.question.startswith("Calculate") and e.answer for e in first)
    task = generated_task(_task(size=6, seed=11, config=SMALL))
    assert [e.question for e in task.examples] == [e.question for e in first]


def test_an_unknown_generator_is_refused_before_the_first_step_naming_the_field():
    with pytest.raises(ReasoningGymError, match=r"task\.dataset\.reasoningGym\.name 'no_such_task'.*basic_arithmetic"):
        reasoning_gym_examples(ReasoningGymSpec(name="no_such_task"))
    with pytest.raises(ReasoningGymError, match=r"task\.dataset\.reasoningGym\.config"):
        reasoning_gym_examples(ReasoningGymSpec(name="basic_arithmetic", size=2, config={"no_such_knob": 1}))
    spec = parse_job_spec({"task": {"dataset": {"reasoningGym": {"name": "no_such_task"}}}})
    assert isinstance(spec, JobSpec)  # the name is checked where reasoning-gym is installed: before step 0
    with pytest.raises(LocalRunError, match=r"task\.dataset\.reasoningGym\.name"):
        check_local_dataset(spec, None)


def test_responses_are_scored_by_reasoning_gym_in_the_reward_sandbox():
    examples = reasoning_gym_examples(ReasoningGymSpec(name="basic_arithmetic", size=3, seed=1, config=SMALL))
    letters = reasoning_gym_examples(ReasoningGymSpec(name="spell_backward", size=1, seed=2))[0]
    items = [(e.answer, e) for e in examples] + [
        ("wrong", examples[0]),
        (f"<answer>{examples[1].answer}</answer>", examples[1]),
    ]
    items += [(letters.answer + "<|im_end|>", letters), ("x", Example("What is 1+1?", "2"))]
    with RewardSandbox("reasoning_gym", SandboxLimits(processes=1)) as sandbox:
        results = sandbox.score(items)
    assert [r.value for r in results] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert results[-1].failure == "exception"  # a prompt reasoning-gym did not make: no score, said so


def test_non_json_values_in_config_or_environment_args_are_refused_naming_the_field():
    """A non-finite number would not survive the CRD's round trip (the fuzz test found it): refused, field named."""
    import pytest

    from rlboost.spec import JobSpecError, parse_job_spec

    bad = [
        ({"dataset": {"reasoningGym": {"name": "chain_sum", "config": {"x": float("inf")}}}}, "reasoningGym.config.x"),
        ({"environment": {"name": "calculator", "args": {"a": [1, float("nan")]}}}, "environment.args.a.1"),
    ]
    for task, field in bad:
        with pytest.raises(JobSpecError, match=field):
            parse_job_spec({"task": task})
