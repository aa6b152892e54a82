"""A micro-batch's loss as the job's algorithm spec defines it: the policy term (trainer.grpo), the rollout correction
and the trainer/worker gap (trainer.corrections), the KL and entropy terms. Torch math, free of DeepSpeed.

The estimator, by `algorithm.rolloutCorrection.mode`:
- 'none': PPO-clip with the old log-probs of `behaviour_logprobs` — an on-policy row's are the trainer's own at the
  step's weights (ratio exactly 1 at the first update, veRL's recomputed old_log_prob), a stale row's the workers'
  (off-policy PPO against the behaviour policy, veRL's bypass mode), or with `oldLogprobs: trainer` the trainer's
  own under the weights that sampled it (the same policy, scored by the trainer: the run is bit-reproducible).
- 'tis' | 'mask': decoupled PPO (Hilton et al. 2021; AReaL): the clip's trust region is around the proximal policy,
  the trainer at the step's weights, for every row; the behaviour policy (the workers', stale or not) enters as the
  detached importance weight pi_proximal / pi_worker, truncated or masked at the cap.
Both: the first pass's old log-probs are the ones of every further update (algorithm.updatesPerStep).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlboost.spec import AlgorithmSpec
from trainer.corrections import mismatch, rollout_weights
from trainer.grpo import (
    LossStats,
    MicroBatch,
    aggregate,
    behaviour_logprobs,
    clipped_policy_loss,
    entropy,
    kl_estimate,
    token_entropy,
)


@dataclass(frozen=True)
class Objective:
    """The loss's settings, read once from the spec. `max_tokens`: the most tokens one sample trains on
    (JobSpec.max_trained_tokens: maxNewTokens, or an agentic episode's model turns), the 'token' normaliser."""

    algorithm: AlgorithmSpec
    max_tokens: int

    @property
    def clip_low(self) -> float:
        return self.algorithm.clip_ratio_low or self.algorithm.clip_ratio

    @property
    def clip_high(self) -> float:
        return self.algorithm.clip_ratio_high or self.algorithm.clip_ratio

    @property
    def decoupled(self) -> bool:
        return self.algorithm.rollout_correction.mode != "none"

    @property
    def kl_in_loss(self) -> bool:
        return self.algorithm.kl_coef > 0 and not self.algorithm.kl_in_reward

    def aggregation(self) -> dict[str, object]:
        return {"aggregation": self.algorithm.loss_aggregation, "max_tokens": self.max_tokens}

    def loss(
        self,
        logits: torch.Tensor,
        logp: torch.Tensor,
        batch: MicroBatch,
        num_sequences: int,
        old: torch.Tensor | None = None,
        ref_logp: torch.Tensor | None = None,
        behaviour: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, LossStats, torch.Tensor]:
        """(loss share, statistics, the old log-probs used). `old` None: the step's first pass (its old log-probs
        are chosen here and the trainer/worker gap is measured); else a further update's, the first pass's.
        `behaviour`: the stale rows' log-probs as the trainer scored them (rolloutCorrection.oldLogprobs 'trainer'),
        in place of the workers'."""
        alg, first = self.algorithm, old is None
        if old is None:
            old = behaviour_logprobs(batch, logp, decoupled=self.decoupled, scored=behaviour)
        mask = batch.loss_mask()
        weights, corrected = self._weights(batch, old, mask)
        loss, stats = clipped_policy_loss(
            logp,
            old,
            batch.advantages,
            mask,
            self.clip_low,
            num_sequences,
            clip_high=self.clip_high,
            importance_ratio=alg.importance_ratio,
            dual_clip=alg.dual_clip,
            weights=weights,
            **self.aggregation(),  # type: ignore[arg-type]
        )
        stats.corrected_tokens = corrected
        if first:
            gap = mismatch(batch, logp, mask)
            stats.mismatch_tokens, stats.mismatch_sum, stats.mismatch_max = gap.tokens, gap.total, gap.largest
        loss = self._kl(loss, stats, logp, ref_logp, mask, num_sequences)
        return self._entropy(loss, stats, logits, mask, num_sequences), stats, old

    def _weights(self, batch: MicroBatch, old: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor | None, int]:
        if not self.decoupled:
            return None, 0
        rc = self.algorithm.rollout_correction
        return rollout_weights(batch, old, mask, rc.mode, rc.level, rc.cap)

    def _kl(
        self,
        loss: torch.Tensor,
        stats: LossStats,
        logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        mask: torch.Tensor,
        num_sequences: int,
    ) -> torch.Tensor:
        if ref_logp is None:
            return loss
        kl = kl_estimate(logp, ref_logp, self.algorithm.kl_estimator)
        stats.kl_sum = float(kl.detach()[mask > 0].sum().item())
        return loss + self.algorithm.kl_coef * aggregate(kl, mask, num_sequences, **self.aggregation())  # type: ignore[arg-type]

    def _entropy(
        self, loss: torch.Tensor, stats: LossStats, logits: torch.Tensor, mask: torch.Tensor, num_sequences: int
    ) -> torch.Tensor:
        alg, on = self.algorithm, mask > 0
        if alg.entropy_coef > 0:
            ent = token_entropy(logits, alg.temperature)
            stats.entropy_sum = float(ent.detach()[on].sum().item())
            return loss - alg.entropy_coef * aggregate(ent, mask, num_sequences, **self.aggregation())  # type: ignore[arg-type]
        with torch.no_grad():  # a diagnostic only: no graph, and only at the loss's tokens, not every prompt position
            stats.entropy_sum = float(entropy(logits.detach()[:, :-1, :][on], alg.temperature).sum().item())
        return loss

    @torch.no_grad()
    def sequence_kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> list[float]:
        """algorithm.klInReward: each row's KL summed over its loss tokens (veRL sums the token-level penalties
        into the outcome reward)."""
        kl = kl_estimate(logp, ref_logp, self.algorithm.kl_estimator) * mask
        return [float(v) for v in kl.sum(dim=1).tolist()]
