"""Tests of rlboost.sampling: per-row reproducibility, the sampled distribution, greedy and top-p."""

from __future__ import annotations

import torch

from rlboost.sampling import sample_next, uniforms


def _full(n: int, value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.full((n,), value, dtype=dtype)


def test_row_is_independent_of_the_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 300, generator=gen)
    temp = torch.rand(32, generator=gen) + 0.5
    seed = torch.randint(0, 2**62, (32,), generator=gen)
    pos = torch.randint(0, 1000, (32,), generator=gen)
    tokens, logprobs = sample_next(logits, temp, seed, pos)
    for i in (0, 7, 31):  # alone
        t, lp = sample_next(logits[i : i + 1], temp[i : i + 1], seed[i : i + 1], pos[i : i + 1])
        assert t.item() == tokens[i].item() and lp.item() == logprobs[i].item()
    perm = torch.randperm(32, generator=gen)  # inside a shuffled batch
    t2, lp2 = sample_next(logits[perm], temp[perm], seed[perm], pos[perm])
    assert torch.equal(t2, tokens[perm]) and torch.equal(lp2, logprobs[perm])


def test_randomness_depends_on_seed_and_position() -> None:
    u = uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 64)
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u, uniforms(torch.tensor([1, 1, 2]), torch.tensor([0, 1, 0]), 64))
    assert bool((u > 0).all() and (u < 1).all())
    assert abs(u.mean().item() - 0.5) < 0.05


def test_distribution_matches_softmax() -> None:
    n, vocab, temp = 20000, 6, 0.7
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]]).expand(n, vocab)
    tokens, logprobs = sample_next(logits, _full(n, temp), torch.arange(n), _full(n, 3, torch.int64))
    expected = torch.softmax(logits[0] / temp, dim=-1) * n
    observed = torch.bincount(tokens, minlength=vocab).double()
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, chi2  # chi-square, 5 dof: p ~ 0.001
    assert torch.allclose(logprobs, torch.log_softmax(logits / temp, -1).gather(-1, tokens[:, None]).squeeze(-1))


def test_different_positions_give_a_fresh_draw() -> None:
    n = 4000
    logits = torch.zeros(n, 2)
    a, _ = sample_next(logits, _full(n, 1.0), torch.arange(n), _full(n, 0, torch.int64))
    b, _ = sample_next(logits, _full(n, 1.0), torch.arange(n), _full(n, 1, torch.int64))
    agree = (a == b).double().mean().item()
    assert 0.45 < agree < 0.55  # independent coin flips agree half the time


def test_greedy_is_argmax_with_untempered_logprob() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(1))
    tokens, logprobs = sample_next(logits, _full(16, 0.0), torch.arange(16), _full(16, 0, torch.int64))
    assert torch.equal(tokens, logits.argmax(-1))
    assert logprobs.dtype == torch.float32 and tokens.dtype == torch.int64
    assert torch.allclose(logprobs, torch.log_softmax(logits, -1).max(-1).values)


def test_mixed_greedy_and_sampled_rows() -> None:
    logits = torch.zeros(2, 1000)
    logits[:, 5] = 0.1  # argmax 5, but sampling almost never picks it
    tokens, _ = sample_next(logits, torch.tensor([0.0, 1.0]), torch.tensor([9, 9]), torch.tensor([0, 0]))
    assert tokens[0].item() == 5
    assert tokens[1].item() != 5


def test_top_p_restricts_to_the_nucleus() -> None:
    n = 3000
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(n, 4)
    tokens, logprobs = sample_next(logits, _full(n, 1.0), torch.arange(n), _full(n, 0, torch.int64), _full(n, 0.7))
    counts = torch.bincount(tokens, minlength=4)
    assert counts[2] == 0 and counts[3] == 0  # {0, 1} already holds 0.8 >= 0.7
    assert counts[0] > 0 and counts[1] > 0
    assert abs(counts[0].item() / n - 0.625) < 0.04  # renormalised 0.5 / 0.8
    assert torch.allclose(logprobs, probs.log()[tokens])  # logprob of the untruncated distribution
    tiny_p, _ = sample_next(logits, _full(n, 1.0), torch.arange(n), _full(n, 0, torch.int64), _full(n, 0.01))
    assert bool((tiny_p == 0).all())  # the top token always survives
