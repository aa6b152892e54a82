"""Load-adaptive chunk cadence: how often each worker flushes its tokens, from the size of the fleet.

The rollout-manager pays per message far more than per token (grpc.aio's read of one message costs about as
much as a few hundred packed tokens), so at 1,000 workers its CPU goes to messages. With a target of at most
`max_messages_per_s` ChunkBatch messages per second from all workers together, each worker flushes every

    period_ms = clamp(workers * 1000 / max_messages_per_s, chunk_max_ms, ceiling_ms)

and its token bound grows by the same factor, so a message carries proportionally more tokens. Changes are
announced only when the period moves by more than `HYSTERESIS` (a fleet growing one worker at a time does not
make the manager tell every worker at every registration).

    tracker = CadenceTracker(rollout_spec)
    if (bounds := tracker.update(connected_workers)) is not None:
        ...  # send ChunkCadence(bounds) to every connected worker
"""

from __future__ import annotations

import math
from typing import NamedTuple

from rlboost.spec import RolloutSpec

CEILING_MS = 1000  # tokens reach the manager at most this late (a dead worker's unflushed tokens: at most this much)
MAX_TOKENS = 4096  # the spec's own bound on chunkMaxTokens
HYSTERESIS = 1.25  # the period is re-announced when the wanted one differs from it by more than this factor


class ChunkBounds(NamedTuple):
    """A worker's chunk bounds: a chunk leaves after `max_tokens` tokens or `max_ms` milliseconds."""

    max_tokens: int
    max_ms: int


def chunk_bounds(workers: int, rollout: RolloutSpec) -> ChunkBounds:
    """The bounds each of `workers` connected workers should flush with (the spec's own when the knob is 0)."""
    base = ChunkBounds(rollout.chunk_max_tokens, rollout.chunk_max_ms)
    if rollout.max_chunk_messages_per_s <= 0 or workers <= 0:
        return base
    ceiling = min(CEILING_MS, rollout.lease_timeout_ms // 5)  # far inside the lease: a flushing worker is alive
    wanted = math.ceil(workers * 1000 / rollout.max_chunk_messages_per_s)
    period = max(base.max_ms, min(ceiling, wanted))
    tokens = min(MAX_TOKENS, max(base.max_tokens, round(base.max_tokens * period / base.max_ms)))
    return ChunkBounds(tokens, period)


class CadenceTracker:
    """The bounds currently announced to the workers, moved only by more than HYSTERESIS at a time."""

    def __init__(self, rollout: RolloutSpec) -> None:
        self.rollout = rollout
        self.current = chunk_bounds(0, rollout)

    def update(self, workers: int) -> ChunkBounds | None:
        """New bounds to announce for `workers` connected workers, or None when the current ones stand."""
        wanted = chunk_bounds(workers, self.rollout)
        if wanted == self.current:
            return None
        back_to_base = wanted.max_ms == self.rollout.chunk_max_ms  # exactly the spec's cadence again
        if not back_to_base and 1 / HYSTERESIS <= wanted.max_ms / self.current.max_ms <= HYSTERESIS:
            return None
        self.current = wanted
        return wanted
