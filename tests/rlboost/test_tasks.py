"""Tests of rlboost.tasks: the seeded addition task, its resumable batch order, rewards and their loader."""

from __future__ import annotations

import pytest

from rlboost.spec import TaskSpec
from rlboost.tasks import Example, RewardLoadError, load_reward, make_task
from rlboost.tasks.rewards import exact_match, format_reward


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


def test_load_reward_resolves_builtins() -> None:
    assert load_reward("rlboost.tasks.rewards:exact_match") is exact_match
    assert load_reward(TaskSpec().reward)("3", Example("What is 1+2?", "3")) == 1.0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("rlboost.tasks.rewards", "must be 'module:function'"),
        (":exact_match", "must be 'module:function'"),
        ("no_such_module_xyz:fn", "cannot import module 'no_such_module_xyz'"),
        ("rlboost.tasks.rewards:nope", "has no attribute 'nope'"),
        ("rlboost.tasks.rewards:_END_MARKERS", "not a function"),
    ],
)
def test_load_reward_errors_name_the_field(entry: str, message: str) -> None:
    with pytest.raises(RewardLoadError, match="task.reward") as err:
        load_reward(entry)
    assert message in str(err.value)
