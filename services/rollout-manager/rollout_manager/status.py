"""What the manager reports about itself: the counts it keeps since start (`Tally`), the typed `ManagerStatus`
GetStatus answers with (rlboost local and chaos read it, never /metrics text), and the gauges it refreshes on every
tick (`Gauges`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rlboost.wire.rollout_io import ManagerStatus, Pool, WorkerStatus

from . import metrics
from .book import RequestBook
from .fleet import Fleet
from .records import Phase, Worker


@dataclass
class Tally:
    """What the manager counted since it started."""

    finished: int = 0
    failed_requests: int = 0
    migrations: int = 0
    migrations_by_reason: Counter[str] = field(default_factory=Counter)
    tokens_received: int = 0
    tokens_lost: int = 0  # received but not kept (offset gaps)
    tokens_regenerated: int = 0  # received again for positions already held
    pool_tokens: Counter[str] = field(default_factory=Counter)  # tokens received per pool (for the tokens/s gauge)


def manager_status(fleet: Fleet, book: RequestBook, tally: Tally, now: float | None) -> ManagerStatus:
    """`now`: the clock the state is driven with, for the busy seconds of spells still open (None: omitted)."""
    workers = [
        WorkerStatus(
            worker_id=w.id,
            pool=w.reg.pool,
            node=w.reg.node,
            weight_version=w.version,
            running=len(w.running),
            capacity=w.reg.capacity,
            tokens_generated=w.tokens_generated,
            inflight_tokens=_inflight_tokens(book, w),
            draining=w.draining,
            memory_released=w.memory_released,
            tokens_per_s=w.tokens_per_s,
            weight_sync_s=w.sync_s,
        )
        for w in fleet.workers.values()
    ]
    return ManagerStatus(
        workers=workers,
        pending=book.pending_total,
        running=book.held_total,
        finished=tally.finished,
        migrations=tally.migrations,
        tokens_received=tally.tokens_received,
        tokens_lost=tally.tokens_lost,
        tokens_regenerated=tally.tokens_regenerated,
        migrations_by_reason=dict(tally.migrations_by_reason),
        busy_seconds=fleet.busy_seconds(now),
    )


def _inflight_tokens(book: RequestBook, w: Worker) -> int:
    """Tokens `w` streamed of responses it is still generating: what its death now would hand over."""
    held = (book.requests[rid] for rid in w.running)
    return sum(len(r.tokens) - r.tokens_at_assign for r in held if r.phase is Phase.RUNNING)


class Gauges:
    """The manager's gauges: workers and requests by state now, tokens/s per pool over the last second or so."""

    def __init__(self) -> None:
        self._rate_mark: tuple[float, Counter[str]] | None = None  # when the rate was last taken, and the counts

    def update(self, now: float, fleet: Fleet, book: RequestBook, tally: Tally) -> None:
        mark = self._rate_mark
        if mark is None or now - mark[0] >= 1.0:  # tokens/s per pool over the last second or so
            if mark is not None:
                for pool in Pool:
                    rate = (tally.pool_tokens[pool.value] - mark[1][pool.value]) / (now - mark[0])
                    metrics.TOKENS_PER_S.labels(pool.value).set(rate)
            self._rate_mark = (now, Counter(tally.pool_tokens))
        pools = Counter(w.reg.pool.value for w in fleet.workers.values())
        released = Counter(w.reg.pool.value for w in fleet.workers.values() if w.memory_released)
        for pool in Pool:
            metrics.WORKERS.labels(pool.value).set(pools.get(pool.value, 0))
            metrics.WORKERS_MEMORY_RELEASED.labels(pool.value).set(released.get(pool.value, 0))
        fleet.slot_seconds(now)  # rlboost_manager_slot_seconds_total grows with the fleet, not only on its changes
        metrics.QUEUE_DEPTH.labels("pending").set(book.pending_total)
        metrics.QUEUE_DEPTH.labels("running").set(book.held_total)
