"""A step that cannot make progress says why (issue 31 item 6): pending requests that no worker could take.

A job whose workers never register (a spec with no worker, a worker that cannot start, a weight version no
worker reaches) used to wait in silence. The manager's tick asks `StarvedWork.check` (pure: the clock is handed
in): once requests have been pending for `after_s` with no live worker at all, or with none holding their weight
version, it logs why, once per `after_s`, and exports rlboost_manager_starved_seconds (0 while work can go on).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable

from . import metrics
from .records import Worker

log = logging.getLogger(__name__)

STARVED_AFTER_S = 30.0


def why_starved(pending: Counter[int], workers: Iterable[Worker]) -> str:
    """Why pending work cannot be placed ('' when it can): no live worker, or none at a wanted version."""
    wanted = sorted(v for v, n in pending.items() if n > 0)
    if not wanted:
        return ""
    live = [w for w in workers if not w.expired and not w.draining]
    if not live:
        return "no rollout worker is registered with the manager (none started, or none could register)"
    held = {w.version for w in live}
    missing = [v for v in wanted if v not in held]
    if len(missing) < len(wanted):
        return ""
    return f"no registered worker holds weight version {missing} (they hold {sorted(held)}): they are still pulling it"


class StarvedWork:
    """Since when pending work has had no worker to go to, and the warning that says so."""

    def __init__(self, after_s: float = STARVED_AFTER_S) -> None:
        self.after_s = after_s
        self.since: float | None = None
        self._warned_at: float | None = None

    def check(self, now: float, pending: Counter[int], workers: Iterable[Worker]) -> float:
        """Seconds the pending work has been starved (0: it is not; the gauge too), logging why every `after_s`."""
        why = why_starved(pending, workers)
        if not why:
            self.since = self._warned_at = None
            metrics.STARVED_SECONDS.set(0.0)
            return 0.0
        if self.since is None:
            self.since = now
        starved = now - self.since
        metrics.STARVED_SECONDS.set(starved)
        if starved >= self.after_s and (self._warned_at is None or now - self._warned_at >= self.after_s):
            self._warned_at = now
            log.warning(
                "pending requests cannot be placed",
                extra={"why": why, "pending": sum(pending.values()), "seconds": round(starved, 1)},
            )
        return starved
