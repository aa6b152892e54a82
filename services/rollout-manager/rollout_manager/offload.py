"""The adaptive offload window applied to a ManagerState: one step's clock and measurements. No network, no clock.

The window T itself (how it adapts) is the pure policy `rlboost.policies.offload.OffloadWindow`; this
controller runs it against the manager's state, step by step:

* a step starts: the window starts with the pools' capacity, and reserved workers take work again;
* every tick: while the window runs, spot idleness is measured; when it elapses, the reserved pool is
  offloaded (no new work) and its running requests are revoked to continue on spot; if spot capacity
  vanishes, the reserved pool takes work again (work is never stranded);
* the step is delivered: T adapts from how long the trainer waited after the offload and how idle spot was.

The offload is length-aware (issue 17, `rlboost.policies.length_offload.longest_first`): the requests that
generated most so far (under a long-tailed length distribution the longest to come) must be first in line for
spot. A migrated request goes back to the head of the pending queue, so each reserved worker's revoke lists its
requests shortest first: flushed in that order, the longest ends up at the head and least-loaded placement gives
it the emptiest spot worker first. The spot target itself is not pinned (the simulator pins it with
`plan_offload`; here least-loaded placement makes the same choice as slots free up).

Without a window (offload off, the default) every method does nothing: reserved workers run to the end.
Every method takes `now` (monotonic seconds), like ManagerState's.

    offload = OffloadController(state, OffloadWindow(OffloadConfig(initial_s=10)))
    offload.start_step(now)
    offload.tick(now, period_s=0.05)   # from the manager's ticker
    offload.end_step(now)
"""

from __future__ import annotations

import logging

from rlboost.policies.length_offload import OffloadCandidate, longest_first
from rlboost.policies.migration import MigrationReason
from rlboost.policies.offload import OffloadWindow, StepMeasurements
from rlboost.wire.rollout_io import Pool

from . import metrics
from .state import ManagerState

log = logging.getLogger(__name__)


class OffloadController:
    """Offloads the reserved pool of one ManagerState when the window elapses. Single-threaded, like the state."""

    def __init__(self, state: ManagerState, window: OffloadWindow | None) -> None:
        self.state = state
        self.window = window  # None: offload off
        self.offloaded_at: float | None = None  # when this step's offload happened
        self.spot_idle_s = 0.0  # this step's spot idleness so far (idle share of spot slots x seconds)
        if window is not None:
            metrics.OFFLOAD_WINDOW.set(window.window_s)

    def start_step(self, now: float) -> None:
        """A step's rollout begins: start the window from the capacity present; reserved workers take work."""
        if self.window is None:
            return
        cap = self.state.capacity_by_pool()
        self.window.start_step(now, cap[Pool.SPOT], cap[Pool.RESERVED])
        self.state.set_pool_offloaded(Pool.RESERVED, False)
        self.offloaded_at = None
        self.spot_idle_s = 0.0

    def tick(self, now: float, period_s: float) -> int:
        """`period_s` after the previous tick: measure, and offload once the window elapsed. Returns requests revoked."""
        if self.window is None:
            return 0
        spot_capacity = self.state.capacity_by_pool()[Pool.SPOT]
        if Pool.RESERVED in self.state.offloaded_pools and spot_capacity == 0:
            self.state.set_pool_offloaded(Pool.RESERVED, False)  # spot vanished: never strand work
        if not self.window.active:
            return 0
        if spot_capacity and self.state.pending == 0:  # spot slots free while nothing waits: offload could be sooner
            self.spot_idle_s += period_s * self.state.idle_slots(Pool.SPOT) / spot_capacity
        if not self.window.should_offload(now):
            return 0
        self.offloaded_at = now
        self.state.set_pool_offloaded(Pool.RESERVED, True)
        revoked = self._revoke_reserved_longest_first(now)
        log.info("offload window elapsed", extra={"window_s": self.window.window_s, "revoked": revoked})
        return revoked

    def _revoke_reserved_longest_first(self, now: float) -> int:
        """Revoke every running request of the reserved pool; per worker shortest first (see the module docstring)."""
        revoked = 0
        for w in list(self.state.workers.values()):
            if w.reg.pool is not Pool.RESERVED:
                continue
            held = [OffloadCandidate(rid, len(self.state.requests[rid].tokens)) for rid in w.running]
            for c in reversed(longest_first(held)):
                revoked += self.state.revoke(c.request_id, MigrationReason.OFFLOAD, now)
        return revoked

    def end_step(self, now: float) -> float | None:
        """The step is delivered: adapt T from its bubble; reserved workers take work again. Returns the new T."""
        if self.window is None:
            return None
        # after the offload the reserved GPUs train, but the trainer waits for the rollout tail on spot
        wait = now - self.offloaded_at if self.offloaded_at is not None else 0.0
        window_s = self.window.end_step(StepMeasurements(trainer_wait_s=wait, spot_idle_s=self.spot_idle_s))
        metrics.OFFLOAD_WINDOW.set(window_s)
        self.state.set_pool_offloaded(Pool.RESERVED, False)
        return window_s
