"""Speed-aware placement and rebalance (issue 16): what the manager does with how fast each worker is.

The workers of one job can decode at very different rates, so placing by load alone leaves a step's longest
responses on its slowest workers, and the step waits for them. With each worker's measured speed (speeds.py) and a
length prior per prompt group and step from finished responses, `SpeedPlacement` (1) places the short expected
responses on slow workers and the long ones on fast workers, and (2) at a step's end, moves the tail off slow
workers to faster free ones, each move pinned to its target until the response is back pending.

The policies themselves are pure functions in rlboost.policies.placement and rlboost.policies.speed_rebalance
(shared with the simulator); this object owns the priors, the pinned moves and the knobs, and leases through
leases.py.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from rlboost.policies.migration import MigrationReason
from rlboost.policies.placement import WorkerSpeed, expected_remaining, place_by_speed, speed_bands
from rlboost.policies.speed_rebalance import RunningResponse, plan_speed_rebalance

from .book import RequestBook
from .fleet import Fleet
from .leases import Leases
from .records import Phase, Request, Worker

# A scheduling pass looks this many pending requests past the free slots for short ones for the slow workers.
PLACEMENT_LOOKAHEAD = 64


class SpeedPlacement:
    """Speed-aware placement and rebalance of one manager. Single-threaded, like the state."""

    def __init__(
        self, book: RequestBook, fleet: Fleet, leases: Leases, aware: bool, migration_cost_s: float, moves: int
    ) -> None:
        """`aware`: place by measured worker speed; False: least-loaded only (the scheduler's own placement).
        `migration_cost_s`: what a rebalance move is expected to cost (revoke round trip and re-prefill of prompt
        and generated tokens); `moves`: the most moves per balancing pass (0: no speed rebalance)."""
        self.book, self.fleet, self.leases = book, fleet, leases
        self.aware = aware
        self.migration_cost_s = migration_cost_s
        self.rebalance_moves = moves
        # step -> prompt index (-1: the whole step) -> (tokens, responses) of finished responses: the length prior
        self._finished_lengths: dict[int, dict[int, tuple[int, int]]] = {}
        # request id -> the faster worker the rebalance revoked it for (its slot waits for it)
        self.targets: dict[str, str] = {}

    @property
    def rebalancing(self) -> bool:
        return self.aware and self.rebalance_moves > 0

    # ---- placement -----------------------------------------------------------------------------------

    def place(
        self,
        queue: deque[str],
        count: int,
        members: dict[str, Worker],
        now: float,
        version_workers: Callable[[], int],
    ) -> int:
        """Place the head of `queue` by measured worker speed: the slow workers take the shortest expected of
        the first free-slots + PLACEMENT_LOOKAHEAD pending requests, the fast ones the longest. What stays is put
        back at the head in its order. O(k log k + (W + k) log W) for k requests placed."""
        free = sum(w.reg.capacity - len(w.running) for w in members.values())
        window = self.book.take_pending(queue, min(count, free) + PLACEMENT_LOOKAHEAD)
        expected = [self.expected_remaining(r) for r in window]
        speeds = [WorkerSpeed(w.id, len(w.running), w.reg.capacity, w.tokens_per_s, w.sync_s) for w in members.values()]
        placed: set[int] = set()
        for i, wid in place_by_speed(min(count, free), expected, speeds):
            req = window[i]
            if wid in req.failed_on and len(req.failed_on) < version_workers():
                continue  # failed there before: the scheduler gives it to another worker with a free slot
            self.leases.assign(req, members[wid], now)
            placed.add(i)
        queue.extendleft(reversed([r.id for i, r in enumerate(window) if i not in placed]))
        return len(placed)

    def expected_remaining(self, req: Request) -> float:
        """Its expected tokens to come, from the mean finished length of its prompt group, else of its step,
        else max_new_tokens (placement.expected_remaining)."""
        budget = req.sampling.max_new_tokens
        lengths = self._finished_lengths.get(req.step, {})
        tokens, n = lengths.get(req.prompt_index) or lengths.get(-1) or (budget, 1)
        return expected_remaining(len(req.tokens), tokens / n, budget)

    def note_length(self, req: Request) -> None:
        """A finished response's length, for the priors of its group and step (steps that ended are dropped)."""
        lengths = self._finished_lengths.get(req.step)
        if lengths is None:
            for step in [s for s in self._finished_lengths if s not in self.book.steps]:
                del self._finished_lengths[step]
            lengths = self._finished_lengths[req.step] = {}
        for key in (req.prompt_index, -1):
            tokens, n = lengths.get(key, (0, 0))
            lengths[key] = (tokens + len(req.tokens), n + 1)

    # ---- speed-aware rebalance: the tail off slow workers at a step's end ---------------------------

    def rebalance(self, members: list[Worker], now: float) -> int:
        """Nothing of their version pending: revoke the responses that would finish sooner on a faster free worker
        of `members` (speed_rebalance.plan_speed_rebalance), each pinned to that worker. Returns how many."""
        inflight = Counter(self.targets.values())  # slots already promised to responses still flushing
        speeds = [
            WorkerSpeed(w.id, min(w.reg.capacity, len(w.running) + inflight[w.id]), w.reg.capacity, w.tokens_per_s)
            for w in members
        ]
        requests = self.book.requests
        running = [
            RunningResponse(rid, w.id, self.expected_remaining(requests[rid]))
            for w in members
            for rid in w.running
            if requests[rid].phase is Phase.RUNNING
        ]
        moved = 0
        for rid, target in plan_speed_rebalance(running, speeds, 0, self.migration_cost_s, self.rebalance_moves):
            if self.leases.revoke(rid, MigrationReason.SPEED_REBALANCE, now):
                self.targets[rid] = target
                moved += 1
        return moved

    def peers(self, members: list[Worker]) -> list[list[Worker]]:
        """`members` by speed band (placement.speed_bands): plain balancing evens load out within a band only, so
        it never hands a fast worker's work to an idle slow one (which the speed rebalance would move back)."""
        bands: dict[int, list[Worker]] = {}
        speeds = [WorkerSpeed(w.id, len(w.running), w.reg.capacity, w.tokens_per_s) for w in members]
        for w, band in zip(members, speed_bands(speeds, horizon_s=1.0), strict=True):
            bands.setdefault(band, []).append(w)
        return list(bands.values())

    def place_targets(self, now: float) -> int:
        """Responses the speed rebalance revoked that are back pending go to the worker they were revoked for,
        if it still holds their version and has a free slot (else placement places them). Returns how many."""
        made = 0
        for rid, wid in list(self.targets.items()):
            req, w = self.book.requests.get(rid), self.fleet.workers.get(wid)
            if req is not None and req.phase is Phase.REVOKING:
                continue  # still flushing on the slow worker
            del self.targets[rid]
            if req is None or req.phase is not Phase.PENDING or w is None:
                continue
            if w.version == req.weight_version and self.fleet.schedulable(w) and len(w.running) < w.reg.capacity:
                self.book.pending[req.weight_version].remove(rid)  # a short queue: nothing was pending at the revoke
                self.leases.assign(req, w, now)
                made += 1
        return made
