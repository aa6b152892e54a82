"""Chaos: preempt a spot worker every `period_s` seconds, preferably one caught mid-response (pure).

The runner sends the signal (SIGKILL, or SIGTERM with `--chaos-signal TERM`). A kill that lands while a
worker holds no request tests nothing, so once a period has elapsed the monkey stays *armed* and picks
its victim among the spot workers the manager's status shows running requests. Only when registered spot
workers stay idle for `patience_periods` periods does it kill an idle one (a real preemption does not wait).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class ChaosMonkey:
    """Decides when to kill and whom. `armed(now)` says a kill is due; `choose` picks a victim or waits."""

    period_s: float
    seed: int = 0
    patience_periods: float = 4.0
    _next_at: float | None = None
    _idle_since: float | None = None  # armed, registered spot workers seen, none busy since then
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"--chaos-kill-every: must be > 0 seconds, got {self.period_s}")
        self._rng = random.Random(self.seed)

    def start(self, now: float) -> None:
        self._next_at = now + self.period_s

    def armed(self, now: float) -> bool:
        """True from the end of a period until the next kill (`fire`)."""
        if self._next_at is None:
            self.start(now)
        return now >= self._next_at

    def fire(self, now: float) -> None:
        """A kill happened: the next one is a full period away (missed periods are not replayed)."""
        self._next_at = now + self.period_s
        self._idle_since = None

    def due(self, now: float) -> bool:
        """True once per period (armed, then fired at once): for callers that need no busy victim."""
        if not self.armed(now):
            return False
        self.fire(now)
        return True

    def pick(self, workers: list[str]) -> str | None:
        return self._rng.choice(sorted(workers)) if workers else None

    def choose(self, now: float, live: list[str], busy: dict[str, int] | None) -> str | None:
        """The victim to kill now, or None to wait. Call only while armed.

        `live`: spot workers alive; `busy`: running requests per worker from the manager's status
        (None when the status is unavailable: then any live worker will do).
        """
        if busy is None:
            return self.pick(live)
        known = [w for w in live if w in busy]
        working = [w for w in known if busy[w] > 0]
        if working:
            return self.pick(working)
        if not known:  # none registered yet (still loading, or waiting for weights): wait for one
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since >= self.patience_periods * self.period_s:
            return self.pick(known)
        return None
