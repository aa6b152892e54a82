"""Chaos: preempt a spot worker every `period_s` seconds, preferably one caught mid-response (pure).

The runner sends the signal (SIGKILL, or SIGTERM with `--chaos-signal TERM`). A kill that lands while a
worker holds no request tests nothing, so once a period has elapsed the monkey stays *armed* and picks
its victim among the spot workers the manager's status shows running requests whose tokens are flowing
(its token count grew since the previous status): a worker that holds requests but has streamed nothing
of them yet (just assigned, in prefill, or pulling the weights they need) would lose nothing worth keeping.
Only when no worker qualifies for `patience_periods` periods does it settle for less: a busy worker, then
an idle one (a real preemption does not wait).
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
    _idle_since: float | None = None  # armed, registered spot workers seen, none streaming since then
    _tokens_seen: dict[str, int] = field(default_factory=dict)  # each worker's token count at the last status
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
        self._tokens_seen = {}  # growth is judged between statuses of the same armed window, not across periods

    def due(self, now: float) -> bool:
        """True once per period (armed, then fired at once): for callers that need no busy victim."""
        if not self.armed(now):
            return False
        self.fire(now)
        return True

    def pick(self, workers: list[str]) -> str | None:
        return self._rng.choice(sorted(workers)) if workers else None

    def choose(
        self, now: float, live: list[str], busy: dict[str, int] | None, tokens: dict[str, int] | None = None
    ) -> str | None:
        """The victim to kill now, or None to wait. Call only while armed.

        `live`: spot workers alive; `busy`: running requests per worker from the manager's status
        (None when the status is unavailable: then any live worker will do); `tokens`: tokens the manager
        has received from each worker so far (None: a busy worker is taken as streaming).
        """
        if busy is None:
            return self.pick(live)
        known = [w for w in live if w in busy]
        working = [w for w in known if busy[w] > 0]
        streaming = working if tokens is None else [w for w in working if self._grew(w, tokens)]
        if tokens is not None:
            self._tokens_seen = {**self._tokens_seen, **tokens}
        if streaming:
            return self.pick(streaming)
        if not known:  # none registered yet (still loading, or waiting for weights): wait for one
            self._idle_since = None
            return None
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since >= self.patience_periods * self.period_s:
            return self.pick(working or known)
        return None

    def _grew(self, worker: str, tokens: dict[str, int]) -> bool:
        return worker in tokens and tokens[worker] > self._tokens_seen.get(worker, tokens[worker])
