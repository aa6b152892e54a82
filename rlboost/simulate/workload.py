"""The RL workload: prompts x group size per step, long-tailed response lengths growing over training."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Workload:
    prompts_per_step: int = 256
    group_size: int = 8
    prompt_tokens: int = 512
    mean_response_start: float = 1500.0  # tokens, at step 0
    mean_response_end: float = 4000.0  # tokens, at the last step (lengths grow during training)
    sigma: float = 0.9  # lognormal shape: a long tail
    max_response: int = 16384

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def response_lengths(self, step: int, steps: int, rng: np.random.Generator, count: int | None = None) -> np.ndarray:
        """Lengths of `count` (default: one step's) responses (int tokens), mean interpolated over training."""
        frac = step / max(steps - 1, 1)
        mean = self.mean_response_start + frac * (self.mean_response_end - self.mean_response_start)
        mu = np.log(mean) - self.sigma**2 / 2  # lognormal with that mean
        lengths = rng.lognormal(mu, self.sigma, self.samples_per_step if count is None else count)
        return np.clip(lengths, 16, self.max_response).astype(np.int64)
