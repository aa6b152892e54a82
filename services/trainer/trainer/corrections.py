"""The trainer/sampler gap: how far the workers' log-probs are from the trainer's, and the rollout correction.

Workers sample with the published bf16 weights through their own kernels; the trainer computes in fp32 (on GPUs in
bf16 through another kernel stack), so the two log-probs of one sampled token differ even at the same weights.

- `mismatch`: |trainer log-prob - worker log-prob| on every token of a row that carries the workers' log-probs and
  weighs, the trainer's at the step's weights before its update (for an on-policy row, the weights it was sampled
  with; for a stale row the gap includes the policy's drift since, as veRL's rollout-correction metrics do). Its
  mean and max are StepReport.logprob_mismatch_mean / _max.
- `rollout_weights`: algorithm.rolloutCorrection. The importance weight w = pi_trainer / pi_worker of the proximal
  policy (the trainer at the step's weights, detached) against the behaviour policy (the worker), per token or per
  row (the product of its tokens'), truncated at `cap` ('tis') or zeroed above it ('mask'): TRL's
  vllm_importance_sampling_mode {token,sequence}_{truncate,mask} with vllm_importance_sampling_clip_max, veRL's
  rollout_is {token,sequence} with rollout_is_threshold. Rows without the workers' log-probs weigh 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.grpo import MicroBatch


@dataclass(frozen=True)
class Mismatch:
    """The trainer/worker log-prob gap of one micro-batch's rows that carry the workers' log-probs."""

    tokens: int
    total: float  # sum of |delta log-prob|
    largest: float


@torch.no_grad()
def mismatch(batch: MicroBatch, logp: torch.Tensor, mask: torch.Tensor) -> Mismatch:
    """The gap on the tokens of `mask` (the loss's) in rows that carry the workers' log-probs."""
    on = (mask > 0) & batch.has_old_logprobs[:, None]
    gap = (logp.detach() - batch.old_logprobs).abs()[on]
    if gap.numel() == 0:
        return Mismatch(0, 0.0, 0.0)
    return Mismatch(int(gap.numel()), float(gap.sum().item()), float(gap.max().item()))


@torch.no_grad()
def rollout_weights(
    batch: MicroBatch, proximal: torch.Tensor, mask: torch.Tensor, mode: str, level: str, cap: float
) -> tuple[torch.Tensor, int]:
    """[B, T] detached importance weights of `mode` ('tis' | 'mask') at `level` ('token' | 'sequence'), and the
    number of loss tokens whose weight went past `cap` (truncated or masked)."""
    log_w = (proximal - batch.old_logprobs) * mask  # 0 outside the loss's tokens: a token weight of 1 there
    if level == "sequence":
        log_w = log_w.sum(dim=1, keepdim=True).expand_as(proximal)
    elif level != "token":
        raise ValueError(f"rollout correction level must be 'token' or 'sequence', got {level!r}")
    w = torch.exp(log_w)
    past = w > cap
    if mode == "tis":
        out = w.clamp(max=cap)
    elif mode == "mask":
        out = torch.where(past, torch.zeros_like(w), w)
    else:
        raise ValueError(f"rollout correction mode must be 'tis' or 'mask', got {mode!r}")
    rows = batch.has_old_logprobs[:, None]
    counted = past & rows & (mask > 0)
    return torch.where(rows, out, torch.ones_like(out)), int(counted.sum().item())
