"""Synthetic bf16 parameter states with RL-like sparse updates, and their real deltas (rlboost.delta)."""

from __future__ import annotations

import torch

import rlboost.delta as rd
from rlboost.weights.checksum import state_checksum


def base_state(seed: int = 0, n: int = 40_000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "layer.0.weight": torch.randn(n, generator=g).to(torch.bfloat16).reshape(200, -1),
        "layer.1.weight": torch.randn(n // 2, generator=g).to(torch.bfloat16),
        "norm.bias": torch.randn(64, generator=g).to(torch.bfloat16),
    }


def step(state: dict[str, torch.Tensor], seed: int, fraction: float = 0.01) -> dict[str, torch.Tensor]:
    """A copy of `state` with about `fraction` of each tensor's elements nudged (like one RL step in bf16)."""
    g = torch.Generator().manual_seed(1000 + seed)
    out = {}
    for name, t in state.items():
        flat = t.clone().reshape(-1)
        mask = torch.rand(flat.numel(), generator=g) < fraction
        flat[mask] = (flat[mask].float() * 1.01 + 1e-3).to(torch.bfloat16)
        out[name] = flat.reshape(t.shape)
    return out


def chain(versions: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """States 0..versions-1, each one step from the previous."""
    states = [base_state(seed)]
    for v in range(1, versions):
        states.append(step(states[-1], v))
    return states


def delta(states: list[dict[str, torch.Tensor]], a: int, b: int) -> bytes:
    return rd.encode(states[a], states[b], base_version=a, version=b)


def checksum(state: dict[str, torch.Tensor]) -> str:
    return state_checksum(state)
