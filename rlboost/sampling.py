"""Reproducible per-sample token sampling: the randomness of a row depends only on (seed, position).

Every row draws its Gumbel noise from a counter-based hash (splitmix64 finaliser in vectorised int64
torch ops) of (seed, position, vocab index). No RNG state is carried, so a sample continues exactly the
same on any worker, alone or inside any batch: the basis of token-exact migration of partial responses.

    tokens, logprobs = sample_next(logits, temperature, seed, position)
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """A 64-bit constant as the signed int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _i64(0x9E3779B97F4A7C15)
_M1 = _i64(0xBF58476D1CE4E5B9)
_M2 = _i64(0x94D049BB133111EB)
_POS_MUL = _i64(0xD6E8FEB86659FD93)


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic, so mask the sign-extended bits)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser; int64 multiplication wraps modulo 2**64 as unsigned would."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def uniforms(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] float64 uniforms in (0, 1), each a pure function of (seed[i], position[i], v)."""
    seed = seed.to(torch.int64)
    position = position.to(torch.int64)
    row = _mix(_mix(seed + _GOLDEN) ^ (position * _POS_MUL))
    v = torch.arange(1, vocab + 1, dtype=torch.int64, device=row.device)
    bits = _mix(row[:, None] + v[None, :] * _GOLDEN)
    # Top 53 bits -> a float64 mantissa; +0.5 keeps 0 and 1 out so both logs stay finite.
    return (_shr(bits, 11).to(torch.float64) + 0.5) * (1.0 / (1 << 53))


def top_p_mask(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean [B, V]: True for tokens outside each row's nucleus (smallest set with mass >= top_p)."""
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p[:, None].to(probs.dtype)
    drop_sorted[:, 0] = False  # the most likely token always stays
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    top_p: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens int64 [B], logprobs float32 [B]).

    temperature 0 means greedy argmax. The logprob is log_softmax(logits / T) at the chosen token in
    float32 (T = 1 for greedy rows), over the full vocabulary: the quantity the trainer recomputes,
    also when top_p truncates what may be sampled.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).to(torch.float32)
    scaled = logits / temp[:, None]
    scores = scaled.double() - torch.log(-torch.log(uniforms(seed, position, logits.shape[-1])))
    if top_p is not None:
        scores = scores.masked_fill(top_p_mask(scaled, top_p.to(logits.device)), float("-inf"))
    sampled = scores.argmax(dim=-1)
    tokens = torch.where(greedy.to(logits.device), logits.argmax(dim=-1), sampled)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs
