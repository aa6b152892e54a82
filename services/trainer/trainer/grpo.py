"""GRPO math, free of DeepSpeed and the network: advantages, collation, log-probs and the clipped loss.

- `group_advantages`: (r - mean_g) / (std_g + eps) within one prompt's group (std unbiased, as TRL).
- `collate`: samples -> a right-padded `MicroBatch` with a response-token mask aligned to the targets (an agentic
  episode's environment tokens masked out: `Trajectory.loss_mask`, so loss, KL, entropy and their statistics
  only ever see the model's own tokens).
- `token_logprobs`: log_softmax(logits / T) at the target tokens, in float32, over the full vocabulary
  (the quantity the rollout workers report, see `rlboost.sampling.sample_next`).
- `clipped_policy_loss`: PPO-clipped token-level loss with behaviour log-probs (asymmetric clip range), the ratio
  per token or per sequence (GSPO), an optional dual clip and importance weights, aggregated per sequence (token
  mean, divided by the step's number of sequences) or per token (sum divided by sequences x max response length,
  Dr. GRPO): both normalisers are known before the step's samples arrive, so a step's loss is the sum of its
  micro-batches' losses and micro-batches can be formed as trajectories stream in. 'token-mean' (DAPO: sum / the
  step's tokens T) takes the 'token' share and the engine rescales the step's gradient by that normaliser / T at
  the optimizer step, once T is known (`token_mean_scale`, trainer.engine).
- `kl_estimate` / `token_entropy`: the optional KL-to-reference penalty (k1, k2, k3) and entropy bonus, aggregated
  the same way.
- Behaviour log-probs: an on-policy sample's ratio is taken against the trainer's own (detached) log-probs,
  so it is exactly 1 (one optimizer step per batch, as verl's recomputed old log-probs); only stale samples
  (bounded staleness) use the workers' log-probs for importance correction. The gradient then does not
  depend on the workers' floating-point arithmetic, which keeps resumed runs bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlboost.wire.rollout_io import Trajectory

ADV_EPS = 1e-6


def group_advantages(rewards: Sequence[float], eps: float = ADV_EPS) -> list[float]:
    """Group-normalised advantages of one prompt's samples; a zero-variance group gets all zeros."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    if n < 2:
        return [0.0]
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1)
    std = math.sqrt(var)
    if std == 0.0:
        # All samples equal: no signal; exact zeros rather than 0/eps noise.
        return [0.0] * n
    return [(r - mean) / (std + eps) for r in rewards]


@dataclass
class Sample:
    """One finished trajectory with its reward and (once its group is complete) its advantage.

    `stale`: generated with an older weight version within the staleness bound (importance-corrected);
    `weight` 0 skips a sample that is too stale (it keeps its slot so micro-batches stay fixed);
    `reward_failure`: why its reward call failed ('timeout', 'budget', ...: rlboost.tasks.sandbox.FAILURE_REASONS),
    None for a real reward; its 0.0 is no real zero and does not belong in its group's baseline;
    `excluded`: why it stays out of its group's baseline ('' = it counts; trainer.advantages);
    `kl_penalty`: algorithm.klInReward's klCoef x its KL, taken off its reward for the advantage.
    """

    trajectory: Trajectory
    reward: float
    advantage: float = 0.0
    stale: bool = False
    weight: float = 1.0
    reward_failure: str | None = None
    excluded: str = ""
    kl_penalty: float = 0.0


@dataclass
class MicroBatch:
    """Tensors of one forward/backward pass. Shifted arrays ([B, L-1]) are aligned to targets input_ids[:, 1:]."""

    input_ids: torch.Tensor  # [B, L] int64, prompt + response, right-padded
    attention_mask: torch.Tensor  # [B, L] int64
    response_mask: torch.Tensor  # [B, L-1] float32: 1 where the target is a response token
    old_logprobs: torch.Tensor  # [B, L-1] float32: behaviour log-probs at response targets, 0 elsewhere
    has_old_logprobs: torch.Tensor  # [B] bool: False when the trajectory carried no usable log-probs
    advantages: torch.Tensor  # [B] float32
    stale: torch.Tensor | None = None  # [B] bool: use the workers' log-probs for the ratio
    loss_weight: torch.Tensor | None = None  # [B] float32: 0 skips a row
    prompt_lengths: torch.Tensor | None = None  # [B] int64: each row's prompt tokens (trainer.prompt_sharing)

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def loss_mask(self) -> torch.Tensor:
        """[B, L-1] the tokens the loss counts: response targets of rows that weigh (a skipped row counts none).
        The one place a per-token mask (environment tokens of a multi-turn episode) multiplies in."""
        if self.loss_weight is None:
            return self.response_mask
        return self.response_mask * self.loss_weight[:, None]

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(
            *(None if getattr(self, f) is None else getattr(self, f).to(device) for f in self.__dataclass_fields__)
        )

    def weightless_row(self) -> MicroBatch:
        """A one-row copy of the first row that weighs nothing: response mask, advantage and loss weight all 0, not
        stale (so its ratio is exactly 1). Its forward and backward pass run every collective a real one does but
        add exactly 0 to the loss, the gradient and the LossStats (trainer.ranks pads short rounds with it)."""
        first = slice(0, 1)
        return MicroBatch(
            self.input_ids[first].clone(),
            self.attention_mask[first].clone(),
            torch.zeros_like(self.response_mask[first]),
            torch.zeros_like(self.old_logprobs[first]),
            torch.zeros(1, dtype=torch.bool),
            torch.zeros(1, dtype=torch.float32),
            stale=torch.zeros(1, dtype=torch.bool),
            loss_weight=torch.zeros(1, dtype=torch.float32),
            prompt_lengths=None if self.prompt_lengths is None else self.prompt_lengths[first].clone(),
        )


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Right-pad prompt+response rows; the response token j of a row with prompt length P is target P+j-1.

    The rows are laid out as Python lists and each tensor made in one call: a few small tensor writes per row cost
    more than the rest of the trainer's Python per micro-batch."""
    if not samples:
        raise ValueError("collate needs at least one sample")
    rows = [s.trajectory.prompt_ids + s.trajectory.response_ids for s in samples]
    length = max(len(r) for r in rows)
    ids, attention, resp_mask, old, has_old = [], [], [], [], []
    for s, row in zip(samples, rows, strict=True):
        t = s.trajectory
        p, n = len(t.prompt_ids), len(t.response_ids)
        if p == 0:
            raise ValueError(f"trajectory {t.request_id}: empty prompt_ids")
        pad, tail = length - len(row), length - p - n  # tail: the shifted row's targets after the response
        ids.append(row + [pad_id] * pad)
        attention.append([1] * len(row) + [0] * pad)
        resp_mask.append([0.0] * (p - 1) + (list(t.loss_mask) if t.loss_mask else [1.0] * n) + [0.0] * tail)
        carries = bool(n) and len(t.logprobs) == n
        old.append([0.0] * (p - 1) + (list(t.logprobs) if carries else [0.0] * n) + [0.0] * tail)
        has_old.append(carries)
    return MicroBatch(
        torch.tensor(ids, dtype=torch.int64),
        torch.tensor(attention, dtype=torch.int64),
        torch.tensor(resp_mask, dtype=torch.float32),
        torch.tensor(old, dtype=torch.float32),
        torch.tensor(has_old, dtype=torch.bool),
        torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        torch.tensor([s.stale for s in samples], dtype=torch.bool),
        torch.tensor([s.weight for s in samples], dtype=torch.float32),
        torch.tensor([len(s.trajectory.prompt_ids) for s in samples], dtype=torch.int64),
    )


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, where: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, L-1] log-probs of input_ids[:, 1:] under logits[:, :-1] / T (T <= 0 means greedy: T = 1).

    `where` ([B, L-1] bool): only those targets' log-probs are computed, the others are 0. The loss reads no other
    (its mask), and the vocabulary's softmax at every prompt position, forward and backward, was a tenth of a
    micro-batch's time on the default example. The same numbers where computed, the same gradient: the softmax is
    per row, and the rows left out get an exact zero gradient either way."""
    scale = temperature if temperature > 0 else 1.0
    targets = input_ids[:, 1:]
    if where is None:
        logp = torch.log_softmax(logits[:, :-1, :].float() / scale, dim=-1)
        return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    rows = torch.log_softmax(logits[:, :-1, :][where].float() / scale, dim=-1)
    picked = rows.gather(-1, targets[where].unsqueeze(-1)).squeeze(-1)
    return torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(where, picked)


MAX_STATS = ("mismatch_max",)  # LossStats fields that combine by max (micro-batches, ranks); the rest add


@dataclass
class LossStats:
    """Diagnostics of one micro-batch (sums, so micro-batches add up; `MAX_STATS` combine by max)."""

    tokens: int
    clipped_tokens: int
    ratio_sum: float
    abs_logp_diff_sum: float  # |logp_new - logp_old|: the ratio's log (0 on on-policy rows at the first update)
    kl_sum: float = 0.0  # KL to the reference (algorithm.klEstimator), summed over response tokens
    entropy_sum: float = 0.0  # policy entropy, summed over response tokens
    mismatch_tokens: int = 0  # tokens of rows with the workers' log-probs, at the first update
    mismatch_sum: float = 0.0  # |trainer log-prob - worker log-prob| summed over those tokens
    mismatch_max: float = 0.0  # ... and its largest
    corrected_tokens: int = 0  # tokens whose rollout-correction weight was truncated or masked

    def __add__(self, o: LossStats) -> LossStats:
        return LossStats(
            **{
                f: max(getattr(self, f), getattr(o, f)) if f in MAX_STATS else getattr(self, f) + getattr(o, f)
                for f in self.__dataclass_fields__
            }
        )


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    num_sequences: int,
    aggregation: str = "sequence",
    max_tokens: int = 0,
) -> torch.Tensor:
    """Reduce [B, T] token values to the micro-batch's share of the step's scalar.

    'sequence': sum over rows of the row's token mean, / num_sequences.
    'token': sum of all tokens / (num_sequences x max_tokens): every token weighs the same.
    'token-mean': the same share as 'token'; the step's sum is rescaled to / T at its end (`token_mean_scale`).
    """
    if num_sequences <= 0:
        raise ValueError(f"num_sequences must be > 0, got {num_sequences}")
    if aggregation == "sequence":
        per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_seq.sum() / num_sequences
    if aggregation in ("token", "token-mean"):
        if max_tokens <= 0:
            raise ValueError(f"token aggregation needs max_tokens > 0, got {max_tokens}")
        return (per_token * mask).sum() / (num_sequences * max_tokens)
    raise ValueError(f"loss aggregation must be 'sequence', 'token' or 'token-mean', got {aggregation!r}")


def token_mean_scale(num_sequences: int, max_tokens: int, tokens: int) -> float:
    """'token-mean': the factor that turns a step's summed 'token' shares (normaliser num_sequences x max_tokens,
    known up front) into its token mean (normaliser T = `tokens`, the step's loss tokens on every rank, known only
    once its last micro-batch is in). Gradients are linear in the loss, so the accumulated gradient times this
    factor is the gradient of sum / T. 1.0 for a step with no token (nothing to scale)."""
    return num_sequences * max_tokens / tokens if tokens > 0 else 1.0


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float,
    num_sequences: int,
    clip_high: float | None = None,
    aggregation: str = "sequence",
    max_tokens: int = 0,
    importance_ratio: str = "token",
    dual_clip: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-clipped loss: max(-A r, -A clip(r, 1 - clip_ratio, 1 + clip_high)) per token, aggregated.

    `num_sequences` is the whole step's count (not the micro-batch's), so the micro-batches' losses add up
    to the step's loss and their gradients accumulate to the step's gradient. `importance_ratio` 'sequence':
    r is the row's exp(mean token log-ratio) (GSPO), the same for its tokens. `dual_clip` c > 1: for A < 0
    the token loss is min(that, -A c) (dual-clip PPO). `weights` [B, T] (detached): the token losses are
    multiplied by them (rollout correction, trainer.corrections).
    """
    if num_sequences <= 0:
        raise ValueError(f"num_sequences must be > 0, got {num_sequences}")
    high = clip_ratio if clip_high is None else clip_high
    ratio = torch.exp(_log_ratio(logp, old_logp, mask, importance_ratio))
    adv = advantages.to(logp.dtype)[:, None]
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip > 0:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, num_sequences, aggregation, max_tokens)
    with torch.no_grad():
        on = mask > 0
        stats = LossStats(
            tokens=int(on.sum().item()),
            clipped_tokens=int(((clipped > unclipped) & on).sum().item()),
            ratio_sum=float(ratio[on].sum().item()),
            abs_logp_diff_sum=float((logp - old_logp).abs()[on].sum().item()),
        )
    return loss, stats


def _log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """[B, T] log of the importance ratio: per token, or each row's masked mean broadcast to its tokens (GSPO; the
    gradient flows through the mean, so each token gets r_seq / |y| x its own log-prob's gradient)."""
    log_ratio = logp - old_logp
    if level == "token":
        return log_ratio
    if level == "sequence":
        per_row = (log_ratio * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        return per_row[:, None].expand_as(log_ratio)
    raise ValueError(f"importance ratio must be 'token' or 'sequence', got {level!r}")


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1 (>= 0, unbiased)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) at the sampled tokens (Schulman, "Approximating KL divergence"):
    k1 = log pi - log pi_ref (unbiased, can be negative), k2 = (log pi - log pi_ref)^2 / 2 (biased, but its expected
    gradient on samples of pi is the KL's), k3 = `kl_k3` (unbiased, >= 0)."""
    if estimator == "k3":
        return kl_k3(logp, ref_logp)
    d = logp - ref_logp
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    raise ValueError(f"KL estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, L-1] entropy of the next-token distribution (logits / T) at each target position."""
    return entropy(logits[:, :-1, :], temperature)


def entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[...] entropy of each row's next-token distribution (logits [..., V] / T); rows are independent."""
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def behaviour_logprobs(
    batch: MicroBatch, logp: torch.Tensor, decoupled: bool = False, scored: torch.Tensor | None = None
) -> torch.Tensor:
    """Old log-probs of the ratio: the workers' for stale rows that carry them, else the current policy's
    (detached: ratio exactly 1, see the module docstring). `decoupled` (a rollout correction is on): the current
    policy's for every row, the proximal policy of decoupled PPO; the workers' enter as importance weights.
    `scored`: the behaviour policy's log-probs as the trainer computed them, for every stale row instead of the
    workers' (rolloutCorrection.oldLogprobs 'trainer')."""
    fallback = logp.detach()
    if batch.stale is None or decoupled:
        return fallback
    if scored is not None:
        return torch.where(batch.stale[:, None], scored, fallback)
    use = batch.stale & batch.has_old_logprobs
    return torch.where(use[:, None], batch.old_logprobs, fallback)
