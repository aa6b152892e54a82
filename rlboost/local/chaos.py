"""Chaos: kill a random spot worker every `period_s` seconds (pure; the runner sends the SIGKILL)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class ChaosMonkey:
    """Decides when to kill and whom. `due(now)` is true once per period; `pick` chooses a victim."""

    period_s: float
    seed: int = 0
    _next_at: float | None = None
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"--chaos-kill-every: must be > 0 seconds, got {self.period_s}")
        self._rng = random.Random(self.seed)

    def start(self, now: float) -> None:
        self._next_at = now + self.period_s

    def due(self, now: float) -> bool:
        """True when a kill is due; each period fires at most once (missed periods are not replayed)."""
        if self._next_at is None:
            self.start(now)
        if now < self._next_at:
            return False
        self._next_at = now + self.period_s
        return True

    def pick(self, workers: list[str]) -> str | None:
        return self._rng.choice(sorted(workers)) if workers else None
