"""rlboost.delta.exceeds: the count that lets a publisher skip encoding a delta it would drop as too large.

It may only say "larger" when encode() really is larger: checked against the real encoder on states of every
density, around the quarter-changed rule that sends a tensor whole, and on a tensor of several segments."""

from __future__ import annotations

import pytest
import torch

import rlboost.delta as rd


def _moved(base: dict[str, torch.Tensor], fractions: dict[str, float], seed: int) -> dict[str, torch.Tensor]:
    """`base` with exactly round(fraction * numel) elements of each tensor moved by one bf16 step."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in base.items():
        flat = t.clone().reshape(-1)
        pick = torch.randperm(flat.numel(), generator=g)[: round(fractions[name] * flat.numel())]
        flat.view(torch.int16)[pick] += 1
        out[name] = flat.reshape(t.shape)
    return out


def _state(sizes: dict[str, int], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(k, generator=g).to(torch.bfloat16) for n, k in sizes.items()}


def _size(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> int:
    return len(rd.encode(base, new, base_version=0, version=1))


@pytest.mark.parametrize("seed", range(6))
def test_exceeds_only_when_the_encoded_delta_is_larger(seed):
    sizes = {"big": 3 << 20, "mid": 40_000, "small": 4096, "tiny": 7}  # big: 6 MB, several segments
    base = _state(sizes, seed)
    g = torch.Generator().manual_seed(100 + seed)
    fractions = {n: float(torch.rand(1, generator=g)) * 0.5 for n in sizes}  # around the quarter rule
    new = _moved(base, fractions, seed)
    size = _size(base, new)
    assert not rd.exceeds(base, new, size)  # never "larger" than what encode() makes
    whole = sum(2 * k for n, k in sizes.items() if round(fractions[n] * k) > k // 4)  # the tensors sent whole
    assert not whole or rd.exceeds(base, new, whole - 1)  # and it finds them


def test_the_quarter_rule_is_the_encoders_own():
    """One element past a quarter changed: the encoder sends the tensor whole, and exceeds knows it; at exactly a
    quarter it may go sparse (smaller than the tensor), and exceeds does not claim otherwise."""
    base = _state({"w": 4096})
    nbytes = 4096 * 2
    at_quarter = _moved(base, {"w": 0.25}, 1)
    assert _size(base, at_quarter) < nbytes and not rd.exceeds(base, at_quarter, nbytes - 1)
    past = dict(at_quarter)
    flat = past["w"].clone()
    unchanged = (flat.view(torch.int16) == base["w"].view(torch.int16)).nonzero()[0]
    flat.view(torch.int16)[unchanged] += 1
    past["w"] = flat
    assert _size(base, past) > nbytes and rd.exceeds(base, past, nbytes - 1)


def test_a_dense_update_is_known_larger_and_mismatched_states_are_left_to_the_encoder():
    base = _state({"a": 50_000, "b": 20_000})
    dense = {n: (t.float() + 1e-2 * torch.randn(t.shape)).to(torch.bfloat16) for n, t in base.items()}
    assert rd.exceeds(base, dense, 0.8 * 70_000 * 2)
    assert not rd.exceeds(base, base, 0)  # nothing changed: nothing certain
    assert not rd.exceeds(base, {"a": dense["a"]}, 0)  # a missing tensor: encode() raises and says which
    assert not rd.exceeds(base, {"a": dense["a"][:10], "b": dense["b"]}, 0)
