"""Chaos: preempt a spot worker caught streaming an unfinished response, at most once per period (pure).

The runner sends the signal (SIGKILL, or SIGTERM with `--chaos-signal TERM`). A kill is triggered by an
event, not by the clock alone: the monkey is *armed* from the start and again `period_s` after each kill,
and while armed it kills only a spot worker that the manager's status shows holding tokens of a response
still running on it (`WorkerStatus.inflight_tokens > 0`). A kill that lands between responses tests
nothing, so the monkey never settles for an idle worker; and because the first kill waits for the first
streamed token rather than for a wall-clock time, a fast machine cannot finish the run before it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class ChaosMonkey:
    """Decides when to kill and whom. `armed(now)` says a kill is wanted; `choose` picks a victim or waits."""

    period_s: float
    seed: int = 0
    _next_at: float | None = None  # None: armed (the first kill waits only for a victim)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"--chaos-kill-every: must be > 0 seconds, got {self.period_s}")
        self._rng = random.Random(self.seed)

    def armed(self, now: float) -> bool:
        """True until the first kill, then from `period_s` after each kill until the next."""
        return self._next_at is None or now >= self._next_at

    def fire(self, now: float) -> None:
        """A kill happened: the next one is a full period away (missed periods are not replayed)."""
        self._next_at = now + self.period_s

    def choose(self, live: list[str], inflight: dict[str, int] | None) -> str | None:
        """The victim to kill now, or None to wait. Call only while armed.

        `live`: spot workers alive; `inflight`: per worker, tokens it streamed of responses still running on
        it, from the manager's status (None when no status could be had: wait, never a blind kill).
        """
        streaming = sorted(w for w in live if inflight and inflight.get(w, 0) > 0)
        return self._rng.choice(streaming) if streaming else None
