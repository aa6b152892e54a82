"""Speed-aware placement and rebalance (issue 16): the part of `ManagerState` that knows how fast each worker is.

The workers of one job can decode at very different rates, so placing by load alone
leaves a step's longest responses on its slowest workers, and the step waits for them. This mixin measures each
worker (decode rate and weight-sync time, EWMAs folded in as requests leave it and as it reports a new version),
keeps a length prior per prompt group and step from finished responses, and uses both to (1) place the short
expected responses on slow workers and the long ones on fast workers, and (2) at a step's end, move the tail off
slow workers to faster free ones (each move pinned to its target until the response is back pending).

A mixin, not a collaborator: it reads and writes the bookkeeping `ManagerState.__init__` sets up (`requests`,
`workers`, `_pending`, `_finished_lengths`, `_speed_targets`, `speed_migration_cost_s`, `speed_rebalance_moves`,
...) and calls its transitions (`_assign`, `revoke`, `_schedulable`); the policies themselves are pure functions
in rlboost.policies.placement and rlboost.policies.speed_rebalance.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from rlboost.policies.migration import MigrationReason
from rlboost.policies.placement import WorkerSpeed, expected_remaining, place_by_speed, speed_bands
from rlboost.policies.speed_rebalance import RunningResponse, plan_speed_rebalance

from . import metrics
from .records import Phase, Request, Worker

# Speed-aware placement: a scheduling pass looks this many pending requests past the free slots for short ones
# for the slow workers; a worker's decode rate and sync time are EWMAs with this weight on the newest sample; a
# request that streamed fewer tokens than MIN_RATE_TOKENS on a worker says nothing about its rate.
PLACEMENT_LOOKAHEAD = 64
SPEED_EWMA = 0.2
MIN_RATE_TOKENS = 8


class SpeedPlacement:
    """`ManagerState`'s speed-aware placement and rebalance (see the module docstring)."""

    def _place_by_speed(
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
        window = self._take_pending(queue, min(count, free) + PLACEMENT_LOOKAHEAD)
        expected = [self._expected_remaining(r) for r in window]
        speeds = [WorkerSpeed(w.id, len(w.running), w.reg.capacity, w.tokens_per_s, w.sync_s) for w in members.values()]
        placed: set[int] = set()
        for i, wid in place_by_speed(min(count, free), expected, speeds):
            req = window[i]
            if wid in req.failed_on and len(req.failed_on) < version_workers():
                continue  # failed there before: _fill_free_slots gives it to another worker
            self._assign(req, members[wid], now)
            placed.add(i)
        queue.extendleft(reversed([r.id for i, r in enumerate(window) if i not in placed]))
        return len(placed)

    def _take_pending(self, queue: deque[str], n: int) -> list[Request]:
        """Up to `n` distinct pending requests off the head of `queue` (stale ids dropped). An id can be queued
        twice: a dropped pending request leaves its entry behind, and a step sent again (a restarted trainer)
        queues the same ids anew; both entries then name the one request, which must be placed once."""
        out: dict[str, Request] = {}
        while queue and len(out) < n:
            req = self.requests.get(queue.popleft())
            if req is not None and req.phase is Phase.PENDING:
                out.setdefault(req.id, req)
        return list(out.values())

    def _expected_remaining(self, req: Request) -> float:
        """Its expected tokens to come, from the mean finished length of its prompt group, else of its step,
        else max_new_tokens (placement.expected_remaining)."""
        budget = req.sampling.max_new_tokens
        lengths = self._finished_lengths.get(req.step, {})
        tokens, n = lengths.get(req.prompt_index) or lengths.get(-1) or (budget, 1)
        return expected_remaining(len(req.tokens), tokens / n, budget)

    def _note_length(self, req: Request) -> None:
        """A finished response's length, for the priors of its group and step (steps that ended are dropped)."""
        lengths = self._finished_lengths.get(req.step)
        if lengths is None:
            for step in [s for s in self._finished_lengths if s not in self._steps]:
                del self._finished_lengths[step]
            lengths = self._finished_lengths[req.step] = {}
        for key in (req.prompt_index, -1):
            tokens, n = lengths.get(key, (0, 0))
            lengths[key] = (tokens + len(req.tokens), n + 1)

    def _observe_rate(self, w: Worker, req: Request, now: float | None) -> None:
        """The request leaves `w`: fold the rate it decoded at there into the worker's EWMA. Not from a worker
        that went silent (its lease expired: the silence is no decode rate) nor from a few tokens (noise)."""
        tokens = len(req.tokens) - req.tokens_at_assign
        if now is None or w.expired or tokens < MIN_RATE_TOKENS or now <= req.assigned_at:
            return
        rate = tokens / (now - req.assigned_at)
        w.tokens_per_s = rate if w.tokens_per_s <= 0 else w.tokens_per_s + SPEED_EWMA * (rate - w.tokens_per_s)
        metrics.REQUEST_DECODE_RATE.labels(w.reg.pool.value).observe(rate)

    def _observe_sync(self, w: Worker, version: int, now: float) -> None:
        """`w` reports holding `version`: if that is the one the manager asked it for, its sync time is measured."""
        if w.sync_asked_at is None or version < w.requested_version or version == w.version:
            return
        took = max(0.0, now - w.sync_asked_at)
        w.sync_s = took if w.sync_s <= 0 else w.sync_s + SPEED_EWMA * (took - w.sync_s)
        w.sync_asked_at = None
        metrics.WEIGHT_SYNC.labels(w.reg.pool.value).observe(took)

    # ---- speed-aware rebalance (issue 16): the tail off slow workers at a step's end -------------------

    def _speed_rebalance(self, members: list[Worker], now: float) -> int:
        """Nothing of their version pending: revoke the responses that would finish sooner on a faster free worker
        of `members` (speed_rebalance.plan_speed_rebalance), each pinned to that worker. Returns how many."""
        inflight = Counter(self._speed_targets.values())  # slots already promised to responses still flushing
        speeds = [
            WorkerSpeed(w.id, min(w.reg.capacity, len(w.running) + inflight[w.id]), w.reg.capacity, w.tokens_per_s)
            for w in members
        ]
        running = [
            RunningResponse(rid, w.id, self._expected_remaining(self.requests[rid]))
            for w in members
            for rid in w.running
            if self.requests[rid].phase is Phase.RUNNING
        ]
        moved = 0
        for rid, target in plan_speed_rebalance(
            running, speeds, 0, self.speed_migration_cost_s, self.speed_rebalance_moves
        ):
            if self.revoke(rid, MigrationReason.SPEED_REBALANCE, now):
                self._speed_targets[rid] = target
                moved += 1
        return moved

    def _speed_peers(self, members: list[Worker]) -> list[list[Worker]]:
        """`members` by speed band (placement.speed_bands): plain balancing evens load out within a band only, so
        it never hands a fast worker's work to an idle slow one (which the speed rebalance would move back)."""
        bands: dict[int, list[Worker]] = {}
        speeds = [WorkerSpeed(w.id, len(w.running), w.reg.capacity, w.tokens_per_s) for w in members]
        for w, band in zip(members, speed_bands(speeds, horizon_s=1.0), strict=True):
            bands.setdefault(band, []).append(w)
        return list(bands.values())

    def _place_speed_targets(self, now: float) -> int:
        """Responses the speed rebalance revoked that are back pending go to the worker they were revoked for,
        if it still holds their version and has a free slot (else placement places them). Returns how many."""
        made = 0
        for rid, wid in list(self._speed_targets.items()):
            req, w = self.requests.get(rid), self.workers.get(wid)
            if req is not None and req.phase is Phase.REVOKING:
                continue  # still flushing on the slow worker
            del self._speed_targets[rid]
            if req is None or req.phase is not Phase.PENDING or w is None:
                continue
            if w.version == req.weight_version and self._schedulable(w) and len(w.running) < w.reg.capacity:
                self._pending[req.weight_version].remove(rid)  # a short queue: nothing was pending at the revoke
                self._assign(req, w, now)
                made += 1
        return made
