"""A step's advantages from its samples' rewards: the group baseline, its normalisation and what stays out of it.
Torch-free; both kinds of step (trainer.assembly, trainer.partial_assembly) and algorithm.klInReward use it.

- What stays out (`exclusion`): a sample the rollout-manager dropped (finish_reason 'failed'), one whose reward call
  failed (the judge's RewardResult.failure: a timeout, a sandbox refusal, a crash...) and one too stale to train on
  (loss weight 0) carry no reward signal. Each keeps its slot (micro-batches stay fixed) but stays out of its
  group's mean and std, and of the step's std, and gets advantage 0: what TRL does with unscorable completions
  (NaN rewards, nan-aware mean and std). A new reason is one more line in `exclusion`.
- `algorithm.advantageNormalization`, over a group's counted samples with value v = reward - kl_penalty:
  'group' (v - mean) / (std + eps), the group's unbiased std (GRPO; `grpo.group_advantages`, unchanged);
  'batch' (v - group mean) / (the step's std + eps), the std of every counted value of the step (TRL
  scale_rewards='batch'); 'none' v - group mean (Dr. GRPO; veRL norm_adv_by_std_in_grpo=False).
  Fewer than 2 counted samples in a group, or a zero std: advantage 0.
- 'batch' and klInReward need the whole step before any advantage is known (`needs_whole_batch`): such a step
  trains once its rollout is complete.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from rlboost.spec import AlgorithmSpec
from trainer.grpo import ADV_EPS, Sample, group_advantages
from trainer.judge import FAILED

DROPPED, REWARD_FAILED, TOO_STALE = "dropped", "reward_failed", "too_stale"


def exclusion(finish_reason: str | None, reward_failure: str | None, weight: float) -> str:
    """Why a sample stays out of its group's baseline ('' when it counts)."""
    if finish_reason == FAILED:
        return DROPPED
    if reward_failure:
        return REWARD_FAILED
    if weight == 0.0:
        return TOO_STALE
    return ""


def needs_whole_batch(alg: AlgorithmSpec) -> bool:
    """Whether a step's advantages need all of its groups (its training cannot stream beside its rollout)."""
    return alg.advantage_normalization == "batch" or alg.kl_in_reward


def assign(groups: list[list[Sample]], normalization: str) -> None:
    """Set the advantage of every sample of `groups` (each one prompt's samples; 'batch': the whole step)."""
    batch_std = _std([v for g in groups for v in _values(g)]) if normalization == "batch" else 0.0
    for group in groups:
        counted = [s for s in group if not s.excluded]
        for s, a in zip(counted, _advantages(_values(group), normalization, batch_std), strict=True):
            s.advantage = a
        for s in group:
            if s.excluded:
                s.advantage = 0.0


def regroup(samples: Iterable[Sample]) -> list[list[Sample]]:
    """Samples by group (origin step, prompt), in order of first appearance."""
    groups: dict[tuple[int, int], list[Sample]] = {}
    for s in samples:
        groups.setdefault((s.trajectory.step, s.trajectory.prompt_index), []).append(s)
    return list(groups.values())


def _values(group: list[Sample]) -> list[float]:
    return [s.reward - s.kl_penalty if s.kl_penalty else s.reward for s in group if not s.excluded]


def _advantages(values: list[float], normalization: str, batch_std: float) -> list[float]:
    if normalization == "group":
        return group_advantages(values)
    if normalization not in ("batch", "none"):
        raise ValueError(f"advantage normalization must be 'group', 'batch' or 'none', got {normalization!r}")
    if len(values) < 2:
        return [0.0] * len(values)
    mean = sum(values) / len(values)
    if normalization == "none":
        return [v - mean for v in values]
    if batch_std == 0.0:
        return [0.0] * len(values)
    return [(v - mean) / (batch_std + ADV_EPS) for v in values]


def _std(values: list[float]) -> float:
    """Unbiased std (as the group's); 0 below 2 values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
