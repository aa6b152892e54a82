"""Validation metrics: the unbiased pass@k estimator and the summary of one evaluation (spec.evaluation).

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", the Codex paper): of n responses
to a prompt, c pass; the chance that at least one of k drawn without replacement passes is
1 - C(n-c, k) / C(n, k), computed as a running product (no huge binomials). Averaged over prompts. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rlboost.wire.events import ValidationReport


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n responses of which c pass (1 <= k <= n, 0 <= c <= n)."""
    if not (1 <= k <= n and 0 <= c <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k holds a passing response
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


@dataclass(frozen=True)
class ScoredResponse:
    """One validation response: its reward, its length, whether its reward call failed."""

    reward: float
    tokens: int
    failed: bool = False


def summarize(
    step: int, weight_version: int, groups: Sequence[Sequence[ScoredResponse]], k: int, threshold: float, seconds: float
) -> ValidationReport:
    """The ValidationReport of responses grouped by prompt (each group of k); a response passes when its reward
    is at least `threshold`."""
    responses = [r for group in groups for r in group]
    if not responses:
        raise ValueError("an evaluation needs at least one response")
    passed = [(len(group), sum(r.reward >= threshold for r in group)) for group in groups if group]
    return ValidationReport(
        step=step,
        weight_version=weight_version,
        k=k,
        prompts=len(passed),
        seconds=seconds,
        reward_mean=math.fsum(r.reward for r in responses) / len(responses),
        pass_at_1=math.fsum(pass_at_k(n, c, 1) for n, c in passed) / len(passed),
        pass_at_k=math.fsum(pass_at_k(n, c, min(k, n)) for n, c in passed) / len(passed),
        response_tokens_mean=sum(r.tokens for r in responses) / len(responses),
        reward_failures=sum(r.failed for r in responses),
    )
