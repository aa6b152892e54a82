"""GRPO math: group advantages, collation masks, log-probs and the clipped loss against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from rlboost.wire.rollout_io import Trajectory
from trainer.grpo import (
    Sample,
    behaviour_logprobs,
    clipped_policy_loss,
    collate,
    group_advantages,
    token_logprobs,
)


def traj(prompt: list[int], response: list[int], logprobs: list[float] | None = None, p: int = 0, g: int = 0):
    return Trajectory(
        request_id=f"s0-p{p}-g{g}",
        step=0,
        prompt_index=p,
        sample_index=g,
        prompt_ids=prompt,
        response_ids=response,
        logprobs=logprobs if logprobs is not None else [-1.0] * len(response),
        finish_reason="stop",
        weight_version=0,
    )


def test_group_advantages_normalise_within_the_group():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    std = math.sqrt(sum((r - 0.5) ** 2 for r in [1, 0, 0, 1]) / 3)  # unbiased
    assert adv == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-5)
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)


def test_zero_variance_group_gives_exact_zero_advantages():
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]
    assert group_advantages([0.0, 0.0]) == [0.0, 0.0]


def test_collate_masks_only_response_targets_and_pads_right():
    a = Sample(traj([5, 6, 7], [8, 9], [-0.5, -0.25]), reward=1.0, advantage=2.0)
    b = Sample(traj([5], [4, 3, 2, 1], None, g=1), reward=0.0, advantage=-1.0)
    b.trajectory.logprobs = []  # no behaviour log-probs -> ratio 1 fallback
    mb = collate([a, b], pad_id=0)
    assert mb.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 1]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]
    # Row a: targets are input_ids[1:] = [6, 7, 8, 9]; 8 and 9 are the response -> positions 2, 3.
    assert mb.response_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert mb.old_logprobs[0].tolist() == [0, 0, -0.5, -0.25]
    assert mb.has_old_logprobs.tolist() == [True, False]
    assert mb.advantages.tolist() == [2.0, -1.0]
    assert mb.num_tokens == 6

    short = Sample(traj([5, 6], [7], p=1), reward=0.0)
    mb2 = collate([short, a], pad_id=99)
    assert mb2.input_ids[0].tolist() == [5, 6, 7, 99, 99]
    assert mb2.attention_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert mb2.response_mask[0].tolist() == [0, 1, 0, 0]  # padding is never a target


def test_token_logprobs_use_temperature_and_greedy_means_t1():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 2]])
    got = token_logprobs(logits, ids, temperature=0.5)
    want0 = torch.log_softmax(torch.tensor([4.0, 0.0, 0.0]), -1)[1]
    want1 = torch.log_softmax(torch.tensor([0.0, 2.0, 0.0]), -1)[2]
    assert got[0].tolist() == pytest.approx([want0.item(), want1.item()], rel=1e-6)
    greedy = token_logprobs(logits, ids, temperature=0.0)
    assert greedy[0, 0].item() == pytest.approx(torch.log_softmax(logits[0, 0], -1)[1].item(), rel=1e-6)


def test_clipped_loss_matches_a_hand_computation():
    clip = 0.2
    logp = torch.log(torch.tensor([[0.5, 0.6, 0.9], [0.3, 0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.5, 0.4, 0.3], [0.6, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, stats = clipped_policy_loss(logp, old, adv, mask, clip, num_sequences=4)
    # Row 0 (A=1): ratios 1, 1.5, 3 -> min(r, clip(r)) = 1, 1.2, 1.2 -> token losses -1, -1.2, -1.2.
    row0 = (-1.0 - 1.2 - 1.2) / 3
    # Row 1 (A=-2): ratio 0.5; -A*r = 1.0, -A*clip(r)=2*0.8=1.6 -> max = 1.6 (only the first token counts).
    row1 = 1.6
    assert loss.item() == pytest.approx((row0 + row1) / 4, rel=1e-5)
    assert stats.tokens == 4
    assert stats.clipped_tokens == 3


def test_loss_gradient_is_zero_where_clipped_and_nonzero_inside():
    logp = torch.log(torch.tensor([[1.5 * 0.4, 0.4]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.4, 0.4]]))
    loss, _ = clipped_policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), 0.2, num_sequences=1)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0  # ratio 1.5 > 1.2 with A > 0: clipped, no gradient
    assert logp.grad[0, 1].item() == pytest.approx(-0.5)  # d/dlogp of -A*exp(logp-old)/2 at ratio 1


def test_padding_does_not_change_the_loss():
    logp = torch.tensor([[-1.0, -2.0, 5.0, 7.0]])
    old = torch.tensor([[-1.1, -1.9, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    padded, _ = clipped_policy_loss(logp, old, torch.tensor([0.7]), mask, 0.2, 1)
    plain, _ = clipped_policy_loss(logp[:, :2], old[:, :2], torch.tensor([0.7]), mask[:, :2], 0.2, 1)
    assert padded.item() == pytest.approx(plain.item(), rel=1e-7)


def test_missing_behaviour_logprobs_fall_back_to_ratio_one():
    s = Sample(traj([1, 2], [3, 4], []), reward=0.0, advantage=1.0)
    mb = collate([s], pad_id=0)
    logp = torch.tensor([[-0.3, -0.7, -0.9]])
    old = behaviour_logprobs(mb, logp)
    assert torch.equal(old, logp)


def test_loss_rejects_zero_sequences():
    with pytest.raises(ValueError, match="num_sequences"):
        clipped_policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1), 0.2, 0)
