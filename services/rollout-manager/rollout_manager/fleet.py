"""The workers the manager knows: their records, which of them have a free slot, the weight versions they hold, the
pools whose new work is stopped (offload), what they say about themselves (heartbeats, versions, drain), the
seconds each pool spent busy, and the request slot-seconds the fleet held (capacity x time).

Bookkeeping only: what becomes of the requests a worker holds when it leaves or goes silent is lifecycle.py's.
"""

from __future__ import annotations

from collections import Counter

from rlboost.wire.rollout_io import Pool, WorkerRegistration

from . import metrics
from .effects import Effects
from .records import Worker
from .speeds import observe_sync


class Fleet:
    """The registered workers of one manager. Single-threaded, like the state."""

    def __init__(self, effects: Effects) -> None:
        self.effects = effects
        self.workers: dict[str, Worker] = {}
        # Workers with a free slot: a scheduling pass looks at these only, not at every worker (1,000 of them,
        # nearly all full, with a pass after every finished request). Kept by add, hold, let_go and remove.
        self.free: dict[str, None] = {}
        self.versions: Counter[int] = Counter()  # version -> workers holding it (any state)
        self.offloaded_pools: set[Pool] = set()  # pools the offload window stopped (their GPUs train): no new work
        self._registrations = 0
        # Seconds each pool's workers held at least one request, of busy spells that ended (open spells are added
        # at status time): kept on hold/let_go, not per token, so the spot scaler's busy share costs nothing.
        self._busy_s: Counter[str] = Counter()
        # Request slots registered now (their capacities), and their slot-seconds up to _slots_at (the share of a
        # step's slot-seconds preemptions cost: preemption_costs.py)
        self._slots, self._slot_s, self._slots_at = 0, 0.0, None

    # ---- joining and leaving -----------------------------------------------------------------------

    def add(self, reg: WorkerRegistration, now: float) -> Worker:
        """A worker joined (its id is not registered: a re-joining one was removed first)."""
        self._registrations += 1
        self.slot_seconds(now)
        self._slots += reg.capacity
        w = Worker(reg=reg, version=reg.weight_version, last_seen=now, seq=self._registrations)
        self.workers[reg.worker_id] = w
        self.free[reg.worker_id] = None
        self.versions[w.version] += 1
        self.effects.dirty = True
        return w

    def remove(self, worker_id: str, now: float) -> Worker | None:
        """The worker's stream ended: it is forgotten, with its unsent commands. Its requests are the caller's."""
        self.effects.forget_worker(worker_id)
        w = self.workers.pop(worker_id, None)
        if w is None:
            return None
        self.end_busy(w, now)
        self.slot_seconds(now)
        self._slots -= w.reg.capacity
        self.free.pop(worker_id, None)
        self.versions[w.version] -= 1
        self.effects.dirty = True
        return w

    # ---- what workers say --------------------------------------------------------------------------

    def alive(self, worker_id: str, now: float) -> Worker | None:
        """The worker spoke: its lease runs from now. None: not registered."""
        w = self.workers.get(worker_id)
        if w is not None:
            w.last_seen = now
            if w.expired:  # a worker that went silent is back: it may take work again
                w.expired = False
                self.effects.dirty = True
        return w

    def on_heartbeat(self, worker_id: str, weight_version: int, now: float, memory_released: bool = False) -> None:
        w = self.alive(worker_id, now)
        if w is not None:
            observe_sync(w, weight_version, now)
            self.set_version(w, weight_version)
            if w.memory_released != memory_released:
                w.memory_released = memory_released
                # a resumed worker's capacity is free again
                self.effects.dirty = self.effects.dirty or not memory_released

    def on_weight_version(self, worker_id: str, weight_version: int, now: float) -> None:
        w = self.alive(worker_id, now)
        if w is not None:
            observe_sync(w, weight_version, now)
            self.set_version(w, weight_version)

    def on_drain_notice(self, worker_id: str, now: float) -> None:
        """The worker announced it is going away (SIGTERM): no new work; its requests migrate when it stops."""
        w = self.alive(worker_id, now)
        if w is not None:
            w.draining = True

    def drain(self, node: str, worker_ids: list[str], reason: str) -> list[str]:
        """A preemption notice: mark matching workers draining and send them DrainCommand. Returns their ids."""
        wanted = set(worker_ids)
        matched = [w for w in self.workers.values() if w.id in wanted or (node and w.reg.node == node)]
        for w in matched:
            if not w.draining:
                w.draining = True
                self.effects.box(w.id).drain = reason or "preemption"
        return [w.id for w in matched]

    def set_version(self, w: Worker, version: int) -> None:
        if version != w.version:
            self.versions[w.version] -= 1
            self.versions[version] += 1
            w.version = version
            self.effects.dirty = True

    # ---- who may take work -------------------------------------------------------------------------

    def schedulable(self, w: Worker) -> bool:
        return w.eligible and w.reg.pool not in self.offloaded_pools

    def schedulable_at(self, version: int) -> int:
        """Schedulable workers holding `version`, busy or not (O(workers): only for requests that failed)."""
        return sum(1 for w in self.workers.values() if w.version == version and self.schedulable(w))

    def free_workers(self) -> list[Worker]:
        """The workers with a free slot, in registration order (scheduling visits them in it)."""
        return sorted((self.workers[wid] for wid in self.free), key=lambda w: w.seq)

    def set_pool_offloaded(self, pool: Pool, offloaded: bool) -> None:
        """Stop (or resume) giving a pool new work: reserved workers once the offload window elapsed."""
        if offloaded:
            self.offloaded_pools.add(pool)
        else:
            self.offloaded_pools.discard(pool)
        self.effects.dirty = True

    def capacity_by_pool(self) -> dict[Pool, int]:
        out = {Pool.RESERVED: 0, Pool.SPOT: 0}
        for w in self.workers.values():
            if w.eligible:
                out[w.reg.pool] += w.reg.capacity
        return out

    def idle_slots(self, pool: Pool) -> int:
        """Free request slots of a pool's schedulable workers."""
        return sum(
            w.reg.capacity - len(w.running) for w in self.workers.values() if w.reg.pool is pool and self.schedulable(w)
        )

    # ---- slots and busy spells ---------------------------------------------------------------------

    def hold(self, w: Worker, request_id: str, now: float) -> None:
        """`w` took the request: a busy spell starts with its first; a full worker leaves the free ones."""
        if not w.running:
            w.busy_since = now
        w.running.add(request_id)
        if len(w.running) >= w.reg.capacity:
            self.free.pop(w.id, None)

    def let_go(self, w: Worker, request_id: str, now: float | None) -> None:
        """The request left `w`: its busy spell ends with its last; the slot is free again."""
        w.running.discard(request_id)
        if not w.running:
            self.end_busy(w, now)
        if len(w.running) < w.reg.capacity:
            self.free[w.id] = None

    def end_busy(self, w: Worker, now: float | None) -> None:
        """Close the worker's busy spell (its last request left it, or it left)."""
        if w.busy_since is not None and now is not None:
            self._busy_s[str(w.reg.pool)] += max(0.0, now - w.busy_since)
        w.busy_since = None

    def busy_seconds(self, now: float | None) -> dict[str, float]:
        """Per pool: seconds its workers (any that ever registered) held at least one request, up to `now`.
        `now` None (no clock): the spells that ended only, of the pools that had one."""
        if now is None:
            return dict(self._busy_s)
        out = {pool.value: self._busy_s[pool.value] for pool in Pool}
        for w in self.workers.values():
            if w.busy_since is not None:
                out[str(w.reg.pool)] += max(0.0, now - w.busy_since)
        return out

    def slot_seconds(self, now: float | None) -> float:
        """Request slot-seconds of the registered workers since start, up to `now` (None: up to the last change)."""
        if now is not None and self._slots_at is not None and now > self._slots_at:
            grown = self._slots * (now - self._slots_at)
            self._slot_s += grown
            metrics.FLEET_SLOT_SECONDS.inc(grown)
        if now is not None and (self._slots_at is None or now > self._slots_at):
            self._slots_at = now
        return self._slot_s
