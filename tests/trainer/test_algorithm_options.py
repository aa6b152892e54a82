"""The GRPO-family options of issue 32, pure math: each against values computed by hand and against the reference
formula of TRL's or veRL's file that defines it (tests/trainer/references.py names the files and versions).

Options: algorithm.lossAggregation 'token-mean', importanceRatio 'sequence' (GSPO), dualClip, klEstimator k1/k2/k3,
klInReward, rolloutCorrection (tis/mask x token/sequence), advantageNormalization group/batch/none with the
baseline's exclusions, and the trainer/worker log-prob gap.
"""

from __future__ import annotations

import math

import pytest
import torch

from rlboost.spec import AlgorithmSpec
from rlboost.wire.rollout_io import Trajectory
from tests.trainer import references as ref
from trainer import advantages
from trainer.corrections import mismatch, rollout_weights
from trainer.grpo import Sample, aggregate, clipped_policy_loss, collate, kl_estimate, token_mean_scale
from trainer.objective import Objective


def _traj(p: int, g: int, response: list[int], logprobs: list[float] | None = None, step: int = 0) -> Trajectory:
    lp = logprobs if logprobs is not None else [-1.0] * len(response)
    return Trajectory(f"s{step}-p{p}-g{g}", step, p, g, [5, 6], response, lp, "stop", 0)


# ---- lossAggregation: token-mean -----------------------------------------------------------------------------


def test_token_mean_is_the_token_share_rescaled_once_by_the_steps_tokens():
    per_token = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    # By hand: (1 + 1 + 1 + 1 + 4) / 5 tokens = 1.6. Streamed, row by row, each share is over N0 = 2 x 4 = 8 (known
    # before the step's samples arrive) and the step's sum is rescaled by N0 / T = 8 / 5 once T = 5 is known.
    shares = [aggregate(per_token[i : i + 1], mask[i : i + 1], 2, "token-mean", max_tokens=4) for i in range(2)]
    assert [s.item() for s in shares] == [0.5, 0.5]
    assert token_mean_scale(2, 4, 5) == 8 / 5
    assert sum(shares).item() * token_mean_scale(2, 4, 5) == pytest.approx(1.6)
    assert ref.trl_aggregate(per_token, mask, "dapo").item() == pytest.approx(1.6)
    assert ref.verl_agg_loss(per_token, mask, "token-mean").item() == pytest.approx(1.6)
    assert token_mean_scale(2, 4, 0) == 1.0  # nothing trained: nothing to scale


def test_the_three_aggregations_match_trl_and_verl_loss_types():
    g = torch.Generator().manual_seed(1)
    per_token = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1.0] * 5, [1.0, 1.0, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    seq = aggregate(per_token, mask, 3, "sequence")
    assert seq.item() == pytest.approx(ref.trl_aggregate(per_token, mask, "grpo").item(), rel=1e-6)
    assert seq.item() == pytest.approx(ref.verl_agg_loss(per_token, mask, "seq-mean-token-mean").item(), rel=1e-6)
    tok = aggregate(per_token, mask, 3, "token", max_tokens=5)
    assert tok.item() == pytest.approx(ref.trl_aggregate(per_token, mask, "dr_grpo", 5).item(), rel=1e-6)
    assert tok.item() == pytest.approx(ref.verl_agg_loss(per_token, mask, "seq-mean-token-sum-norm", 15).item())
    mean = aggregate(per_token, mask, 3, "token-mean", max_tokens=5).item() * token_mean_scale(3, 5, 8)
    assert mean == pytest.approx(ref.trl_aggregate(per_token, mask, "dapo").item(), rel=1e-6)


# ---- importanceRatio: sequence (GSPO) --------------------------------------------------------------------------


def test_sequence_ratio_is_the_rows_geometric_mean_clipped_as_a_whole():
    logp = torch.log(torch.tensor([[0.5, 0.6], [0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.4, 0.4], [0.6, 0.6]]))
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, -1.0])
    loss, stats = clipped_policy_loss(logp, old, adv, mask, 0.2, 2, importance_ratio="sequence")
    # By hand: row 0 s = sqrt(1.25 x 1.5) = 1.369 > 1.2 with A > 0: -1.2 per token; row 1 s = 0.5 < 0.8 with A < 0:
    # max(0.5, 0.8) = 0.8 per token. Sequence aggregation: (-1.2 + 0.8) / 2.
    assert math.sqrt(1.25 * 1.5) > 1.2
    assert loss.item() == pytest.approx((-1.2 + 0.8) / 2, rel=1e-6)
    assert stats.clipped_tokens == 4 and stats.ratio_sum == pytest.approx(2 * math.sqrt(1.875) + 2 * 0.5, rel=1e-6)


def test_sequence_ratio_loss_and_gradient_match_trl_and_verl_gspo():
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 6, generator=g) - 0.5
    logp = (old + 0.15 * torch.randn(4, 6, generator=g)).requires_grad_(True)
    mask = torch.tensor([[1.0] * 6, [1.0] * 4 + [0.0] * 2, [1.0] * 2 + [0.0] * 4, [1.0] * 6])
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])
    ours, _ = clipped_policy_loss(logp, old, adv, mask, 0.2, 4, clip_high=0.28, importance_ratio="sequence")
    trl = ref.trl_aggregate(ref.trl_per_token_loss(logp, old, adv, mask, 0.2, 0.28, "sequence"), mask, "grpo")
    verl = ref.verl_agg_loss(ref.verl_gspo_pg_losses(logp, old, adv, mask, 0.2, 0.28), mask, "seq-mean-token-mean")
    grads = [torch.autograd.grad(x, logp, retain_graph=True)[0] for x in (ours, trl, verl)]
    assert ours.item() == pytest.approx(trl.item(), rel=1e-6) and ours.item() == pytest.approx(verl.item(), rel=1e-5)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2])
    assert grads[0].abs().sum() > 0  # some rows inside the clip range: the comparison is not of zeros


# ---- dualClip ------------------------------------------------------------------------------------------------


def test_dual_clip_bounds_the_loss_of_a_negative_advantage_at_a_large_ratio():
    logp = torch.log(torch.tensor([[0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.1, 0.1]]))  # ratio 5
    mask = torch.ones(1, 2)
    neg, _ = clipped_policy_loss(logp, old, torch.tensor([-1.0]), mask, 0.2, 1)
    dual, _ = clipped_policy_loss(logp, old, torch.tensor([-1.0]), mask, 0.2, 1, dual_clip=3.0)
    pos, _ = clipped_policy_loss(logp, old, torch.tensor([1.0]), mask, 0.2, 1, dual_clip=3.0)
    # By hand: A = -1, r = 5: PPO max(-A r, -A clip(r)) = max(5, 1.2) = 5; dual clip min(5, -A c) = 3. A = +1:
    # max(-5, -1.2) = -1.2, the dual clip does not apply.
    assert neg.item() == pytest.approx(5.0, rel=1e-6)
    assert dual.item() == pytest.approx(3.0, rel=1e-6) and pos.item() == pytest.approx(-1.2, rel=1e-6)


def test_dual_clip_matches_verls_vanilla_policy_loss():
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(5, 4, generator=g) - 0.2
    logp = (old + 1.5 * torch.randn(5, 4, generator=g)).requires_grad_(True)  # ratios well past c on some tokens
    mask = torch.ones(5, 4)
    adv = torch.tensor([-1.0, 1.0, -0.3, -2.0, 0.5])
    ours, _ = clipped_policy_loss(logp, old, adv, mask, 0.2, 5, clip_high=0.28, dual_clip=3.0, aggregation="sequence")
    verl = ref.verl_agg_loss(ref.verl_vanilla_pg_losses(logp, old, adv, 0.2, 0.28, 3.0), mask, "seq-mean-token-mean")
    assert ours.item() == pytest.approx(verl.item(), rel=1e-6)
    torch.testing.assert_close(*(torch.autograd.grad(x, logp, retain_graph=True)[0] for x in (ours, verl)))
    ratio = torch.exp(logp - old)
    assert ((ratio > 3.0) & (adv[:, None] < 0)).any()  # the dual clip binds somewhere


# ---- klEstimator, klInReward ---------------------------------------------------------------------------------


def test_kl_estimators_by_hand_and_against_verl():
    logp, ref_logp = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    d = math.log(2.0)  # log pi - log pi_ref
    want = {"k1": d, "k2": d * d / 2, "k3": 0.5 + d - 1}  # k3 = exp(-d) + d - 1
    for name, value in want.items():
        assert kl_estimate(logp, ref_logp, name).item() == pytest.approx(value, rel=1e-6)
        assert ref.verl_kl_penalty_forward(logp, ref_logp, name).item() == pytest.approx(value, rel=1e-6)
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(logp, ref_logp, "k4")


def test_k1_and_k3_are_unbiased_estimates_of_the_kl_and_k2_is_not():
    p, q = [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]
    logp, logq = torch.log(torch.tensor(p)), torch.log(torch.tensor(q))
    expect = {k: float((torch.tensor(p) * kl_estimate(logp, logq, k)).sum()) for k in ("k1", "k2", "k3")}
    exact = ref.schulman_kl(p, q)
    assert expect["k1"] == pytest.approx(exact, rel=1e-5) and expect["k3"] == pytest.approx(exact, rel=1e-5)
    assert abs(expect["k2"] - exact) > 1e-3


def test_kl_in_reward_takes_the_summed_kl_off_the_reward_as_verl_does():
    objective = Objective(AlgorithmSpec(kl_coef=0.1, kl_in_reward=True, kl_estimator="k1"), 8)
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.2, 0.2]]))
    ref_logp = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.2, 0.1, 0.9]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    kls = objective.sequence_kl(logp, ref_logp, mask)
    assert kls[0] == pytest.approx(math.log(2) + 0 + math.log(3), rel=1e-6)  # by hand: sum of log(pi / pi_ref)
    assert kls[1] == pytest.approx(0 + math.log(2), rel=1e-6)  # the masked third token does not count
    for i in range(2):
        verl = ref.verl_kl_in_reward(1.0, logp[i], ref_logp[i], mask[i], 0.1, "k1")
        assert 1.0 - 0.1 * kls[i] == pytest.approx(verl, rel=1e-6)
    group = [Sample(_traj(0, g, [1]), reward=1.0, kl_penalty=0.1 * kl) for g, kl in enumerate(kls)]
    advantages.assign([group], "none")
    # Equal rewards: without the KL no signal; with it, the sample further from the reference is the worse one.
    assert group[0].advantage == pytest.approx(-0.05 * (kls[0] - kls[1]), rel=1e-6) and group[1].advantage > 0


# ---- rolloutCorrection and the trainer/worker gap -------------------------------------------------------------


def _corrected_batch():
    rows = [Sample(_traj(0, 0, [7, 8], [-1.5, -1.0]), 0.0, 1.0), Sample(_traj(0, 1, [7, 8], []), 0.0, 1.0)]
    mb = collate(rows, pad_id=0)  # targets [6, 7, 8]: the response is positions 1 and 2
    proximal = torch.tensor([[-9.0, -1.0, -2.0], [-9.0, -1.0, -2.0]])
    return mb, proximal


def test_rollout_weights_by_hand_truncate_or_mask_past_the_cap():
    mb, proximal = _corrected_batch()
    mask = mb.loss_mask()
    w = {0.5: math.exp(0.5), -1.0: math.exp(-1.0)}  # log w = proximal - worker = 0.5 and -1.0
    tis, n_tis = rollout_weights(mb, proximal, mask, "tis", "token", 1.5)
    assert tis[0].tolist() == pytest.approx([1.0, 1.5, w[-1.0]]) and n_tis == 1  # exp(0.5) = 1.65 truncated
    assert tis[1].tolist() == [1.0, 1.0, 1.0]  # no worker log-probs: nothing to correct
    masked, n_mask = rollout_weights(mb, proximal, mask, "mask", "token", 1.5)
    assert masked[0].tolist() == pytest.approx([1.0, 0.0, w[-1.0]]) and n_mask == 1
    seq, n_seq = rollout_weights(mb, proximal, mask, "mask", "sequence", 1.5)
    assert seq[0].tolist() == pytest.approx([math.exp(-0.5)] * 3) and n_seq == 0  # the product: exp(0.5 - 1.0)


@pytest.mark.parametrize("mode", ["tis", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_rollout_weights_match_trls_vllm_importance_sampling(mode, level):
    g = torch.Generator().manual_seed(4)
    worker = -torch.rand(3, 5, generator=g) - 0.3
    proximal = worker + 0.4 * torch.randn(3, 5, generator=g)
    samples = [Sample(_traj(0, i, [9] * 4, worker[i, 1:].tolist()), 0.0) for i in range(3)]
    mb = collate(samples, pad_id=0)  # prompt [5, 6]: response targets are positions 1..4
    proximal[:, 0] = 0.0
    mask = mb.loss_mask()
    ours, _ = rollout_weights(mb, proximal, mask, mode, level, 1.3)
    trl_mode = f"{level}_{'truncate' if mode == 'tis' else 'mask'}"
    trl = ref.trl_vllm_is_ratio(proximal, mb.old_logprobs, mask, trl_mode, 1.3).expand_as(proximal)
    on = mask > 0
    torch.testing.assert_close(ours[on], trl[on])
    if mode == "tis":
        torch.testing.assert_close(
            ours[on], ref.verl_rollout_is_weights(proximal, mb.old_logprobs, mask, level, 1.3)[on]
        )
    assert (ours[on] != 1.0).any()  # the weights are not all trivially 1


def test_the_gap_is_the_trainers_log_prob_against_the_workers_on_rows_that_carry_them():
    mb, proximal = _corrected_batch()
    gap = mismatch(mb, proximal, mb.loss_mask())
    assert (gap.tokens, gap.total, gap.largest) == (2, pytest.approx(1.5), pytest.approx(1.0))  # |0.5| + |-1.0|
    trl_mean, trl_max = ref.trl_sampling_logp_difference(proximal[:1, 1:], mb.old_logprobs[:1, 1:], torch.ones(1, 2))
    assert gap.total / gap.tokens == pytest.approx(trl_mean) and gap.largest == pytest.approx(trl_max)
    mb.loss_weight = torch.tensor([0.0, 1.0])  # a row that does not train is not measured either
    assert mismatch(mb, proximal, mb.loss_mask()).tokens == 0


def test_decoupled_loss_is_trls_grpo_loss_with_the_vllm_ratio_and_measures_the_gap_once():
    """rolloutCorrection tis: the first pass's ratio is against the trainer itself (1), the worker enters as the
    truncated weight; TRL's grpo loss with vllm_importance_sampling_mode token_truncate gives the same loss and
    gradient. A further update (old given) does not measure the gap again."""
    alg = AlgorithmSpec(rollout_correction={"mode": "tis", "level": "token", "cap": 1.2}, clip_ratio=0.2)
    g = torch.Generator().manual_seed(5)
    samples = [
        Sample(_traj(0, i, [9, 9, 9], (-torch.rand(3, generator=g) - 0.5).tolist()), 0.0, 1.0 - i) for i in range(3)
    ]
    mb = collate(samples, pad_id=0)
    logp = (mb.old_logprobs + 0.3 * torch.randn(3, 4, generator=g)).requires_grad_(True)
    logits = torch.zeros(3, 5, 11)
    loss, stats, old = Objective(alg, 8).loss(logits, logp, mb, 3)
    mask = mb.loss_mask()
    is_ratio = ref.trl_vllm_is_ratio(logp.detach(), mb.old_logprobs, mask, "token_truncate", 1.2)
    trl = ref.trl_aggregate(
        ref.trl_per_token_loss(logp, logp.detach(), mb.advantages, mask, 0.2, 0.2, is_ratio=is_ratio), mask, "grpo"
    )
    assert loss.item() == pytest.approx(trl.item(), rel=1e-6)
    torch.testing.assert_close(*(torch.autograd.grad(x, logp, retain_graph=True)[0] for x in (loss, trl)))
    assert torch.equal(old, logp.detach()) and stats.mismatch_tokens == 9 and stats.corrected_tokens > 0
    _, again, _ = Objective(alg, 8).loss(logits, logp, mb, 3, old=old)
    assert again.mismatch_tokens == 0


# ---- advantageNormalization and the baseline's exclusions ---------------------------------------------------


def _group(rewards: list[float], excluded: dict[int, str] | None = None, p: int = 0) -> list[Sample]:
    excluded = excluded or {}
    return [Sample(_traj(p, g, [1]), r, excluded=excluded.get(g, "")) for g, r in enumerate(rewards)]


def test_group_normalisation_is_unchanged_and_leaves_excluded_samples_out():
    plain = _group([1.0, 0.0, 0.0, 1.0])
    advantages.assign([plain], "group")
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert [s.advantage for s in plain] == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-5)
    # A failed reward call scored 0: kept out, the others are the group [1, 0, 1] (mean 2/3, std sqrt(1/3)).
    failed = _group([1.0, 0.0, 0.0, 1.0], {2: advantages.REWARD_FAILED})
    advantages.assign([failed], "group")
    mean, s = 2 / 3, math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
    assert [x.advantage for x in failed] == pytest.approx([(1 - mean) / s, -mean / s, 0.0, (1 - mean) / s], rel=1e-5)
    lone = _group([1.0, 0.0, 0.5], {1: advantages.DROPPED, 2: advantages.TOO_STALE})
    advantages.assign([lone], "group")
    assert [x.advantage for x in lone] == [0.0, 0.0, 0.0]  # one sample left: no baseline, no signal


@pytest.mark.parametrize("normalization", ["group", "batch", "none"])
def test_normalisations_match_trls_scale_rewards_with_unscorable_rewards_as_nan(normalization):
    rewards = [[1.0, 0.0, 0.5, 0.0], [0.2, 0.9, 0.9, 0.1], [1.0, 1.0, 0.0, 1.0]]
    out = {(0, 1): advantages.REWARD_FAILED, (1, 3): advantages.DROPPED, (2, 0): advantages.TOO_STALE}
    groups = [_group(r, {g: why for (p, g), why in out.items() if p == i}, p=i) for i, r in enumerate(rewards)]
    advantages.assign(groups, normalization)
    nan_marked = [[math.nan if (p, g) in out else r for g, r in enumerate(rs)] for p, rs in enumerate(rewards)]
    trl = ref.trl_advantages(nan_marked, normalization, eps=1e-6)
    for group, want in zip(groups, trl, strict=True):
        assert [s.advantage for s in group] == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_batch_normalisation_by_hand_and_none_against_verl():
    groups = [_group([1.0, 0.0]), _group([1.0, 1.0], p=1)]
    advantages.assign(groups, "batch")
    std = math.sqrt((0.25**2 * 3 + 0.75**2) / 3)  # the step's rewards [1, 0, 1, 1]: mean 0.75, std 0.5
    assert [s.advantage for g in groups for s in g] == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], rel=1e-5)
    rewards = [[1.0, 0.0, 0.5], [0.3, 0.3, 0.9]]
    for normalization, by_std in (("none", False), ("group", True)):
        groups = [_group(r, p=i) for i, r in enumerate(rewards)]
        advantages.assign(groups, normalization)
        want = ref.verl_grpo_advantages(rewards, norm_adv_by_std_in_grpo=by_std)
        assert [[s.advantage for s in g] for g in groups] == [pytest.approx(w, rel=1e-6) for w in want]


def test_exclusion_reasons_and_regrouping():
    assert advantages.exclusion("failed", None, 0.0) == advantages.DROPPED
    assert advantages.exclusion("stop", "timeout", 1.0) == advantages.REWARD_FAILED
    assert advantages.exclusion("stop", None, 0.0) == advantages.TOO_STALE
    assert advantages.exclusion("length", None, 1.0) == ""
    samples = [Sample(_traj(p, g, [1], step=s), 0.0) for s, p, g in [(0, 1, 0), (1, 1, 0), (0, 1, 1), (1, 1, 1)]]
    assert [[x.trajectory.request_id for x in grp] for grp in advantages.regroup(samples)] == [
        ["s0-p1-g0", "s0-p1-g1"],
        ["s1-p1-g0", "s1-p1-g1"],
    ]
