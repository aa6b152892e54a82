"""The scheduling pass and balancing: pending work onto free slots (by measured speed, else least-loaded), idle
workers moved to newer weight versions, and load evened out when workers of a version sit idle.

A pass costs O(free workers), not O(workers): a full worker can take nothing, so only those with a free slot are
looked at. It runs only when something freed or needs capacity (`Effects.dirty`). The placement policies are pure
functions in rlboost.policies (shared with the simulator).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable

from rlboost.policies.balancing import BalanceWorker, HeldRequest, plan_rebalance
from rlboost.policies.migration import MigrationReason
from rlboost.policies.placement import VersionView, WorkerLoad, place, version_moves

from .book import RequestBook
from .effects import Effects
from .fleet import Fleet
from .leases import Leases
from .records import Phase, Worker
from .speed_placement import SpeedPlacement


class Scheduler:
    """Places one manager's pending requests and balances its workers. Single-threaded, like the state."""

    def __init__(
        self,
        book: RequestBook,
        fleet: Fleet,
        leases: Leases,
        speed: SpeedPlacement,
        effects: Effects,
        balance_min_excess: int,
    ) -> None:
        self.book, self.fleet, self.leases, self.speed, self.effects = book, fleet, leases, speed, effects
        self.balance_min_excess = balance_min_excess

    def schedule(self, now: float) -> int:
        """Place pending work and move idle workers to newer weight versions. Returns assignments made."""
        self.effects.dirty = False
        if not any(c > 0 for c in self.book.pending_count.values()):
            return 0  # nothing to place, and no version to move anyone to
        pinned = self.speed.place_targets(now) if self.speed.targets else 0
        by_version: dict[int, list[Worker]] = {}
        for w in self.fleet.free_workers():
            if self.fleet.schedulable(w):
                by_version.setdefault(w.version, []).append(w)
        made = 0
        for version, count in list(self.book.pending_count.items()):
            if count <= 0 or version not in by_version:
                continue
            members = {w.id: w for w in by_version[version]}
            version_workers = functools.cache(functools.partial(self.fleet.schedulable_at, version))
            queue = self.book.pending[version]
            if self.speed.aware and any(w.tokens_per_s > 0 for w in members.values()):
                made += self.speed.place(queue, count, members, now, version_workers)
            else:
                made += self._place_least_loaded(queue, count, members, now, version_workers)
            if self.book.pending_count[version] > 0 and queue:
                made += self._fill_free_slots(queue, members.values(), now, version_workers)
        self._push_versions(now)
        return made + pinned

    def _place_least_loaded(
        self, queue: deque[str], count: int, members: dict[str, Worker], now: float, version_workers: Callable[[], int]
    ) -> int:
        made = 0
        targets = place(count, (WorkerLoad(w.id, len(w.running), w.reg.capacity) for w in members.values()))
        for wid in targets:
            req = self.book.pop_pending(queue, wid, version_workers)
            if req is None:
                if not queue:
                    break
                continue  # what is left failed on this worker: another may take it below
            self.leases.assign(req, members[wid], now)
            made += 1
        return made

    def _fill_free_slots(
        self, queue: deque[str], members: Iterable[Worker], now: float, version_workers: Callable[[], int]
    ) -> int:
        """Requests placement aimed at a worker they failed on go to any other worker with a free slot."""
        made = 0
        for w in members:
            while len(w.running) < w.reg.capacity and (req := self.book.pop_pending(queue, w.id, version_workers)):
                self.leases.assign(req, w, now)
                made += 1
        return made

    def _push_versions(self, now: float) -> None:
        pending = {v for v, c in self.book.pending_count.items() if c > 0}
        if not pending:
            return
        target = max(pending)
        if not any(n > 0 and v < target for v, n in self.fleet.versions.items()):
            return  # every worker holds the newest version (the common case): no pass over the workers
        workers = [w for w in self.fleet.workers.values() if self.fleet.schedulable(w)]
        if not any(w.version < target and w.requested_version < target for w in workers):
            return  # nobody would move: skip building a view of every worker
        busy = pending | {v for v, c in self.book.held_count.items() if c > 0}
        views = [VersionView(w.id, w.version, w.requested_version) for w in workers]
        for wid, version in version_moves(views, pending, busy):
            self.fleet.workers[wid].requested_version = version
            self.fleet.workers[wid].sync_asked_at = now  # its weight-sync time runs from here (speeds.observe_sync)
            self.effects.box(wid).set_version = version

    def balance(self, now: float) -> int:
        """Revoke excess requests from overloaded workers when others sit idle. Returns how many."""
        groups: dict[int, list[Worker]] = {}
        for w in self.fleet.workers.values():
            if self.fleet.schedulable(w):
                groups.setdefault(w.version, []).append(w)
        moved = 0
        for version, members in groups.items():
            pending = self.book.pending_count[version]
            if pending > 0 or len(members) < 2:
                continue  # plan_rebalance moves nothing then: skip building a view of every running request
            for peers in self.speed.peers(members) if self.speed.rebalancing else [members]:
                views = [BalanceWorker(w.id, w.reg.capacity, self._running_views(w, now)) for w in peers]
                plan = plan_rebalance(views, pending, self.balance_min_excess)
                for ids in plan.values():
                    moved += sum(self.leases.revoke(rid, MigrationReason.REBALANCE, now) for rid in ids)
            if self.speed.rebalancing:
                moved += self.speed.rebalance(members, now)
        return moved

    def _running_views(self, w: Worker, now: float) -> list[HeldRequest]:
        """What balancing sees of each request running on `w`: its tokens and how long it has run there."""
        requests = self.book.requests
        return [
            HeldRequest(rid, len(requests[rid].tokens), now - requests[rid].assigned_at)
            for rid in w.running
            if requests[rid].phase is Phase.RUNNING
        ]
