"""The reference formulas rlboost's algorithm options are checked against, restated from the files that define them.

Each function restates one formula as its file computes it, in plain torch, written from reading (not copied from):
- TRL `trl/trainer/grpo_trainer.py` (huggingface/trl main at f2cd577, VERSION 1.10.0.dev0): `GRPOTrainer.
  _generate_and_score_completions` (advantages; the vLLM importance-sampling ratio and its sampling_logp_difference
  metric) and `GRPOTrainer._compute_loss` (ratio, clipping, loss types); `nanstd` from `trl/trainer/utils.py`.
- veRL `verl/trainer/ppo/core_algos.py` (volcengine/verl main at b178a3c, version 0.8.0.dev):
  `compute_grpo_outcome_advantage`, `agg_loss`, `compute_policy_loss_vanilla` (dual clip), `compute_policy_loss_gspo`,
  `kl_penalty_forward`; `verl/trainer/ppo/ray_trainer.py` `apply_kl_penalty` (KL in the reward); and
  `verl/trainer/ppo/rollout_corr_helper.py` `compute_rollout_correction_weights`.
"""

from __future__ import annotations

import math

import torch


def trl_nanstd(x: torch.Tensor) -> torch.Tensor:
    """trl/trainer/utils.py nanstd: the NaN-aware std with Bessel's correction count / (count - 1)."""
    keep = x[~torch.isnan(x)]
    mean = keep.mean()
    var = ((keep - mean) ** 2).mean() * keep.numel() / (keep.numel() - 1)
    return var.sqrt()


def trl_advantages(rewards: list[list[float]], scale_rewards: str, eps: float = 1e-4) -> list[list[float]]:
    """grpo_trainer.py, sum_then_normalize: a group's nanmean as baseline; scaled by the group's nanstd ('group'),
    the batch's ('batch') or not ('none'), + eps (1e-4 there; rlboost's, like veRL's, is 1e-6); an unscorable
    completion (reward NaN) stays out of the mean and std and gets 0 (nan_to_num)."""
    flat = torch.tensor([r for g in rewards for r in g], dtype=torch.float64)
    out = []
    for group in rewards:
        g = torch.tensor(group, dtype=torch.float64)
        mean = torch.nanmean(g)
        std = trl_nanstd(g) if scale_rewards == "group" else trl_nanstd(flat)
        adv = g - mean if scale_rewards == "none" else (g - mean) / (std + eps)
        out.append(torch.nan_to_num(adv, nan=0.0).tolist())
    return out


def verl_grpo_advantages(scores: list[list[float]], norm_adv_by_std_in_grpo: bool, eps: float = 1e-6) -> list:
    """core_algos.py compute_grpo_outcome_advantage: per group, (s - mean) / (std + eps) with torch.std (unbiased),
    or s - mean (Dr. GRPO)."""
    out = []
    for group in scores:
        g = torch.tensor(group, dtype=torch.float64)
        mean, std = g.mean(), g.std()
        out.append(((g - mean) / (std + eps) if norm_adv_by_std_in_grpo else g - mean).tolist())
    return out


def trl_per_token_loss(
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    level: str = "token",
    is_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    """grpo_trainer.py _compute_loss (grpo/bnpo/dr_grpo/dapo): log_ratio per token, or its masked mean per sequence
    (importance_sampling_level='sequence'); -min(coef_1 A, clamp(coef_1, 1 - eps_low, 1 + eps_high) A), times the
    vLLM importance-sampling ratio when given."""
    log_ratio = logp - old
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    per_token = per_token.expand_as(logp)
    return per_token if is_ratio is None else per_token * is_ratio


def trl_aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, max_completion_length: int = 0):
    """grpo_trainer.py _compute_loss, one process and no accumulation: 'grpo' mean over rows of the row's token mean,
    'dr_grpo' sum / (rows x max_completion_length), 'dapo' sum / num_items_in_batch (the batch's completion tokens)."""
    if loss_type == "grpo":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    if loss_type == "dapo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    raise ValueError(loss_type)


def trl_vllm_is_ratio(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, mode: str, clip_max: float):
    """grpo_trainer.py: (old - sampling) x mask per token, summed per sequence for sequence_*; exp; clamped at
    clip_max (*_truncate) or zeroed above it (*_mask)."""
    diff = (old - sampling) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, max=clip_max)
    return ratio.masked_fill(ratio > clip_max, 0.0)


def trl_sampling_logp_difference(old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """grpo_trainer.py sampling/sampling_logp_difference/{mean,max}: |old - sampling| over the completion mask."""
    delta = torch.abs(old - sampling)[mask.bool()]
    return float(delta.mean()), float(delta.max())


def verl_vanilla_pg_losses(
    logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float, clip_ratio_c: float
) -> torch.Tensor:
    """core_algos.py compute_policy_loss_vanilla's per-token losses (before agg_loss): the PPO clip, then for A < 0
    min(-A c, that) (dual clip). Its log-ratio clamp at +-20 does not bind on these inputs."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    a = adv.unsqueeze(1).expand_as(logp)
    clip1 = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1 - clip_low, 1 + clip_high))
    clip2 = torch.min(-a * clip_ratio_c, clip1)
    return torch.where(a < 0, clip2, clip1)


def verl_gspo_pg_losses(logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask, clip_low, clip_high):
    """core_algos.py compute_policy_loss_gspo's per-token losses: s_i,t = sg[s_i] pi / sg[pi] with s_i the row's
    exp(mean log-ratio) (log clamped at 10, not binding here), PPO-clipped."""
    seq = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_s = logp - logp.detach() + seq.detach().unsqueeze(-1)
    s = torch.exp(torch.clamp(log_s, max=10.0))
    a = adv.unsqueeze(1)
    return torch.maximum(-a * s, -a * torch.clamp(s, 1 - clip_low, 1 + clip_high))


def verl_agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, loss_scale_factor: int = 0):
    """core_algos.py agg_loss, one data-parallel rank: 'token-mean' sum / tokens, 'seq-mean-token-mean' mean over
    rows of the row's token mean, 'seq-mean-token-sum-norm' sum / loss_scale_factor (Dr. GRPO's constant)."""
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    if mode == "seq-mean-token-mean":
        return ((loss_mat * mask).sum(-1) / (mask.sum(-1) + 1e-8)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (loss_mat * mask).sum() / loss_scale_factor
    raise ValueError(mode)


def verl_kl_penalty_forward(logp: torch.Tensor, ref: torch.Tensor, kind: str) -> torch.Tensor:
    """core_algos.py kl_penalty_forward: k1 logp - ref; k2 (logp - ref)^2 / 2; k3 (low_var_kl) exp(ref - logp) -
    (ref - logp) - 1 with the log-ratio clamped at +-20 and the result at +-10 (neither binds here)."""
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref).square()
    kl = torch.clamp(ref - logp, -20, 20)
    return torch.clamp(torch.exp(kl) - kl - 1, -10, 10)


def verl_kl_in_reward(score: float, old: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, beta: float, kind: str):
    """ray_trainer.py apply_kl_penalty then the GRPO estimator's token-level reward sum: score - beta sum_t kl_t."""
    kld = verl_kl_penalty_forward(old, ref, kind) * mask
    return score - beta * float(kld.sum())


def verl_rollout_is_weights(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, level: str, threshold):
    """rollout_corr_helper.py compute_rollout_correction_weights: log(pi_old / pi_rollout) per token or summed per
    sequence (clamped at +-20), exp, x mask, truncated at the threshold."""
    log_ratio = old - rollout
    if level == "sequence":
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True).expand_as(old)
    w = torch.exp(torch.clamp(log_ratio, -20.0, 20.0)) * mask
    return w.clamp(max=threshold)


def schulman_kl(p: list[float], q: list[float]) -> float:
    """The exact KL(p || q) of two small distributions (what the estimators estimate)."""
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
