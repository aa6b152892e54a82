"""The streaming assembler: micro-batches are released in a fixed order as their groups complete."""

from __future__ import annotations

import random

import pytest

from rlboost.wire.rollout_io import Trajectory
from trainer.batching import StepAssembler, StreamError


def traj(p: int, g: int, step: int = 0, tokens: int = 1) -> Trajectory:
    return Trajectory(
        request_id=f"s{step}-p{p}-g{g}",
        step=step,
        prompt_index=p,
        sample_index=g,
        prompt_ids=[1],
        response_ids=[g] * tokens,
        logprobs=[-1.0] * tokens,
        finish_reason="stop",
        weight_version=0,
    )


def reward(t: Trajectory) -> float:
    return float(t.sample_index % 2)  # a group of 2+ has variance


def add(asm: StepAssembler, t: Trajectory) -> list:
    return asm.add(t, reward(t))


def test_micro_batch_released_as_soon_as_its_groups_complete():
    asm = StepAssembler(0, num_prompts=3, group_size=2, micro_batch_size=2)
    assert add(asm, traj(0, 1)) == []
    ready = add(asm, traj(0, 0))
    assert [[(s.trajectory.prompt_index, s.trajectory.sample_index) for s in mb] for mb in ready] == [[(0, 0), (0, 1)]]
    assert [s.advantage for s in ready[0]] == pytest.approx([-0.7071, 0.7071], rel=1e-3)
    # Prompt 2 completes before prompt 1: its micro-batch waits for micro-batch 1 (fixed order).
    assert add(asm, traj(2, 0)) == [] and add(asm, traj(2, 1)) == []
    add(asm, traj(1, 0))
    ready = add(asm, traj(1, 1))
    assert [mb[0].trajectory.prompt_index for mb in ready] == [1, 2]
    assert asm.complete


def test_micro_batches_straddling_groups_wait_for_both_groups():
    asm = StepAssembler(0, num_prompts=2, group_size=3, micro_batch_size=4)
    for g in range(3):
        out = add(asm, traj(0, g))
    assert out == []  # micro-batch 0 = (0,0),(0,1),(0,2),(1,0): group 1 incomplete
    add(asm, traj(1, 0))
    add(asm, traj(1, 2))
    ready = add(asm, traj(1, 1))
    assert [len(mb) for mb in ready] == [4, 2]


def test_any_arrival_order_gives_the_same_micro_batches():
    def run(seed: int) -> list[list[tuple[int, int, float]]]:
        asm = StepAssembler(0, num_prompts=4, group_size=4, micro_batch_size=3)
        items = [traj(p, g) for p in range(4) for g in range(4)]
        random.Random(seed).shuffle(items)
        out = []
        for t in items:
            for mb in add(asm, t):
                out.append([(s.trajectory.prompt_index, s.trajectory.sample_index, s.advantage) for s in mb])
        assert asm.complete
        return out

    assert run(1) == run(2) == run(3)


def test_duplicates_are_ignored_and_foreign_trajectories_rejected():
    asm = StepAssembler(5, num_prompts=1, group_size=2, micro_batch_size=8)
    add(asm, traj(0, 0, step=5))
    assert add(asm, traj(0, 0, step=5)) == []
    assert asm.duplicates == 1 and asm.received == 1
    assert asm.missing() == [(0, 1)]
    with pytest.raises(StreamError, match="step 4, expected 5"):
        add(asm, traj(0, 1, step=4))
    with pytest.raises(StreamError, match="outside 1 prompts x 2 samples"):
        add(asm, traj(1, 0, step=5))


def test_batch_normalisation_releases_once_every_group_is_in_with_the_steps_std():
    """algorithm.advantageNormalization 'batch': the step's std needs every group, so nothing is released before
    the last one completes; then the advantages are (r - group mean) / the step's std."""
    asm = StepAssembler(0, num_prompts=2, group_size=2, micro_batch_size=2, normalization="batch")
    assert add(asm, traj(0, 0)) == [] and add(asm, traj(0, 1)) == []  # group 0 complete: still held
    assert asm.add(traj(1, 0), 1.0) == []
    ready = asm.add(traj(1, 1), 1.0)
    # Rewards [0, 1 | 1, 1]: the step's mean 0.75, unbiased std 0.5; group 0 centred +-0.5 -> +-1; group 1 -> 0.
    assert [[s.advantage for s in mb] for mb in ready] == [pytest.approx([-1.0, 1.0], rel=1e-5), [0.0, 0.0]]
    assert asm.complete


def test_an_excluded_sample_stays_out_of_its_groups_baseline():
    asm = StepAssembler(0, num_prompts=1, group_size=3, micro_batch_size=3)
    asm.add(traj(0, 0), 1.0)
    asm.add(traj(0, 1), 0.0, excluded="reward_failed")  # scored 0 because its reward call failed
    (ready,) = asm.add(traj(0, 2), 0.0)
    assert [s.excluded for s in ready] == ["", "reward_failed", ""]
    assert [s.advantage for s in ready] == pytest.approx([0.7071, 0.0, -0.7071], rel=1e-3)  # the group [1, 0]
