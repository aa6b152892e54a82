"""GRPO options: asymmetric clipping, token-level aggregation, k3 KL, entropy, stale-sample behaviour log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from rlboost.wire.rollout_io import Trajectory
from trainer.grpo import Sample, aggregate, behaviour_logprobs, clipped_policy_loss, collate, kl_k3, token_entropy


def test_token_aggregation_weighs_every_token_the_same_with_a_fixed_normaliser():
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, 2, "sequence").item() == pytest.approx((1.0 + 4.0) / 2)
    assert aggregate(per_token, mask, 2, aggregation="token", max_tokens=4).item() == pytest.approx(8.0 / (2 * 4))
    # Split into micro-batches, the parts add up to the whole (the normaliser is the step's, known up front).
    parts = sum(aggregate(per_token[i : i + 1], mask[i : i + 1], 2, "token", max_tokens=4) for i in range(2))
    assert parts.item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(per_token, mask, 2, "token")


def test_clip_high_bounds_only_the_upper_side():
    logp = torch.log(torch.tensor([[0.9, 0.1]]))
    old = torch.log(torch.tensor([[0.3, 0.3]]))  # ratios 3 and 1/3
    _, sym = clipped_policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), 0.2, 1)
    loss, wide = clipped_policy_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 2), 0.2, 1, clip_high=5.0)
    assert sym.clipped_tokens == 1 and wide.clipped_tokens == 0  # ratio 3 clipped at 1.2, not at 6
    assert loss.item() == pytest.approx(-(3.0 + 1 / 3) / 2, rel=1e-5)  # A > 0: min(r, clip) = r for both


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere():
    logp = torch.log(torch.tensor([0.5, 0.2]))
    assert kl_k3(logp, logp).abs().max().item() == 0.0
    ref = torch.log(torch.tensor([0.25, 0.4]))
    k = kl_k3(logp, ref)
    assert (k > 0).all() and k[0].item() == pytest.approx(0.5 - math.log(0.5) - 1, rel=1e-5)


def test_entropy_of_uniform_logits_is_log_vocab():
    logits = torch.zeros(1, 3, 7)
    assert token_entropy(logits, 1.0)[0].tolist() == pytest.approx([math.log(7)] * 2, rel=1e-6)


def test_only_stale_rows_use_the_workers_logprobs():
    def smp(stale: bool) -> Sample:
        t = Trajectory("r", 0, 0, 0, [1, 2], [3], [-2.5], "stop", 0)
        return Sample(t, 0.0, 1.0, stale=stale, weight=0.0 if stale else 1.0)

    mb = collate([smp(False), smp(True)], pad_id=0)
    logp = torch.tensor([[-0.1, -0.2], [-0.1, -0.2]])
    old = behaviour_logprobs(mb, logp)
    assert old[0].tolist() == pytest.approx([-0.1, -0.2])  # on-policy: ratio exactly 1
    assert old[1].tolist() == pytest.approx([0.0, -2.5])  # stale: importance-corrected against the worker
    assert mb.loss_weight.tolist() == [1.0, 0.0]


def test_stale_rows_take_the_trainers_scoring_when_it_is_given():
    """rolloutCorrection.oldLogprobs 'trainer': the stale rows' old log-probs are the trainer's scoring under the
    weights that sampled them, not the workers'; an on-policy row keeps the current policy's."""
    t = Trajectory("r", 0, 0, 0, [1, 2], [3], [-2.5], "stop", 0)
    mb = collate([Sample(t, 0.0, 1.0), Sample(t, 0.0, 1.0, stale=True)], pad_id=0)
    logp = torch.tensor([[-0.1, -0.2], [-0.1, -0.2]])
    scored = torch.tensor([[0.0, -0.7], [0.0, -0.9]])
    old = behaviour_logprobs(mb, logp, scored=scored)
    assert old.tolist() == [pytest.approx([-0.1, -0.2]), pytest.approx([0.0, -0.9])]
    assert behaviour_logprobs(mb, logp, decoupled=True, scored=scored).tolist() == old[:1].tolist() * 2
