"""The trainer's groups in flight under partial rollout (trainer.partial.GroupCarry): what each step asks for, which
groups train, duplicates, and checkpoints that take the open groups' prompts again from the real prompt stream."""

from __future__ import annotations

import pytest

from rlboost.spec import TaskSpec
from rlboost.tasks.base import Cursor
from rlboost.tasks.dataset import make_prompts
from rlboost.wire.rollout_io import Trajectory
from trainer.partial import CarryError, GroupCarry


def encode(messages: list[dict[str, str]]) -> list[int]:
    """A stand-in chat template: the characters' code points (the carry only keeps what it is given)."""
    return [ord(c) for m in messages for c in m["content"]]


def traj(step: int, prompt: int, sample: int, spans: list[tuple[int, int]] | None = None) -> Trajectory:
    return Trajectory(
        f"s{step}-p{prompt}-g{sample}",
        step,
        prompt,
        sample,
        [1],
        [2, 3],
        [-0.1, -0.2],
        "stop",
        spans[0][0] if spans else 0,
        version_spans=spans or [],
    )


def test_a_group_trains_once_complete_and_its_missing_samples_are_carried() -> None:
    prompts = make_prompts(TaskSpec(), encode)
    batch = prompts.take(Cursor(), 2)
    carry = GroupCarry(group_size=2)
    carry.open(0, batch.examples, batch.prompt_ids, Cursor())
    carry.start_stream(0)
    assert carry.total == 4 and carry.carried(0) == []
    for t in (traj(0, 0, 0), traj(0, 0, 1), traj(0, 1, 1)):
        assert carry.wants(t)
        carry.add(t, 1.0)
    assert not carry.wants(traj(0, 0, 1))  # re-sent by a retried rollout: once
    with pytest.raises(CarryError, match="belongs to no group in flight"):
        carry.wants(traj(0, 5, 0))
    (done,) = carry.take_complete()
    assert (done.step, done.prompt_index, sorted(done.samples)) == (0, 0, [0, 1])
    (owed,) = carry.carried(1)
    assert (owed.step, owed.prompt_index, owed.sample_indices) == (0, 1, [0])
    assert owed.prompt_ids == batch.prompt_ids[1] and carry.owed() == 1
    carry.add(traj(0, 1, 0, spans=[(0, 1), (1, 1)]), 0.0)  # continued across a version boundary
    (late,) = carry.take_complete()
    assert late.samples[0][0].version_spans == [(0, 1), (1, 1)] and len(carry) == 0


def test_a_checkpoint_takes_the_open_groups_prompts_again_to_roll_them_out_afresh() -> None:
    prompts = make_prompts(TaskSpec(), encode)
    first = prompts.take(Cursor(), 3)
    carry = GroupCarry(group_size=2)
    carry.open(4, first.examples, first.prompt_ids, Cursor())
    carry.add(traj(4, 2, 0), 1.0)
    saved = carry.checkpoint()

    resumed = GroupCarry(group_size=2)
    resumed.restore(saved, make_prompts(TaskSpec(), encode))
    assert resumed.regenerated == 3
    assert [(g.step, g.prompt_index, g.sample_indices) for g in resumed.carried(5)] == [
        (4, 0, [0, 1]),
        (4, 1, [0, 1]),
        (4, 2, [0, 1]),
    ]
    assert [g.prompt_ids for g in resumed.carried(5)] == first.prompt_ids


def test_an_episodes_group_carries_its_environment_task_also_through_a_checkpoint() -> None:
    """task.environment: the manager may no longer hold a carried group's episodes (it restarted), so each
    CarriedGroup names its environment task, as the step's prompts do (PromptItem.task_json)."""
    from trainer.partial import episode_task

    prompts = make_prompts(TaskSpec(), encode)
    batch = prompts.take(Cursor(), 2)
    carry = GroupCarry(group_size=2, episodes=True)
    carry.open(0, batch.examples, batch.prompt_ids, Cursor())
    assert [g.task_json for g in carry.carried(1)] == [episode_task(e) for e in batch.examples]
    resumed = GroupCarry(group_size=2, episodes=True)
    resumed.restore(carry.checkpoint(), make_prompts(TaskSpec(), encode))
    assert [g.task_json for g in resumed.carried(1)] == [episode_task(e) for e in batch.examples]
    assert all(g.task_json == "" for g in GroupCarry(2).carried(1))


def test_stale_tokens_count_an_episode_s_model_tokens_only() -> None:
    from trainer.assembly import older_tokens

    episode = traj(0, 0, 0, spans=[(0, 3), (1, 2)])
    episode.response_ids, episode.loss_mask = [1, 2, 3, 4, 5], b"\x01\x00\x01\x01\x01"  # token 2: the environment's
    assert older_tokens(episode, 1) == 2 and older_tokens(episode, 2) == 4
    assert older_tokens(traj(0, 0, 1, spans=[(0, 1), (1, 1)]), 1) == 1  # single-turn: no mask, every token
