"""A step's rollout as a stream of trajectory batches, within the step's deadline.

A reader task receives the step's trajectories into a queue while the step's consumer judges, assembles and
trains; the consumer takes what arrived meanwhile as one batch (one reward call). Past rollout.stepDeadlineS the
call is cancelled (the manager drops the step's requests) and made again, rollout.stepRetries times (what already
arrived is kept); then StepDeadlineError names what is missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from rlboost.spec import RolloutSpec
from rlboost.wire.rollout_io import RolloutRequest, Trajectory
from trainer import metrics
from trainer.rollout_client import RolloutClient, RolloutError

log = logging.getLogger(__name__)


class StepDeadlineError(RolloutError):
    """A step's rollout passed rollout.stepDeadlineS with its retries spent; the message names what is missing."""


class Progress(Protocol):
    """What the step's assembly says of its progress, for the deadline's messages."""

    received: int
    total: int

    def missing(self) -> list: ...


@dataclass
class StartedRollout:
    """A step's Rollout call under way: the task receiving its trajectories and the queue it fills (None: its end)."""

    queue: asyncio.Queue[Trajectory | None]
    reader: asyncio.Task[None]

    def cancel(self) -> None:
        """End the call (the manager drops the step's requests)."""
        self.reader.cancel()


class RolloutStream:
    """Streams a step's Rollout call in batches, with the step's deadline and retries."""

    def __init__(self, rollout: RolloutSpec, reattach_s: float) -> None:
        self.rollout = rollout
        self.reattach_s = reattach_s  # how long a manager lost mid-step is waited for (the connect timeout)

    async def batches(
        self, rc: RolloutClient, request: RolloutRequest, progress: Progress
    ) -> AsyncIterator[list[Trajectory]]:
        """The step's trajectories, as batches of what arrived while the previous batch was consumed; a stream
        failure is raised after the last batch. Close it (contextlib.aclosing): that ends the reader."""
        async for batch in self.consume(self.start(rc, request, progress)):
            yield batch

    def start(self, rc: RolloutClient, request: RolloutRequest, progress: Progress) -> StartedRollout:
        """Make the step's Rollout call now; its trajectories wait in a queue until `consume` (algorithm.rolloutAhead
        starts the next step's while this one trains)."""
        queue: asyncio.Queue[Trajectory | None] = asyncio.Queue()
        return StartedRollout(queue, asyncio.create_task(self._read(rc, request, queue, progress)))

    async def consume(self, started: StartedRollout) -> AsyncIterator[list[Trajectory]]:
        """A started call's trajectories in batches, as `batches`; closing it ends the call."""
        ended = False
        try:
            while not ended and (first := await started.queue.get()) is not None:
                batch, ended = drain(started.queue, first)
                yield batch
            await started.reader  # re-raises a stream failure
        finally:
            started.cancel()

    async def _read(self, rc: RolloutClient, request: RolloutRequest, queue: asyncio.Queue, progress: Progress) -> None:
        """Receive the step's trajectories into the queue; None marks the end."""
        deadline, retries = self.rollout.step_deadline_s, 0
        try:
            while True:
                try:
                    async with asyncio.timeout(deadline or None):
                        async for traj in self._rollout_call(rc, request, again=retries > 0):
                            metrics.TRAJECTORIES.inc()
                            queue.put_nowait(traj)
                    return
                except TimeoutError:
                    if retries >= self.rollout.step_retries:
                        metrics.STEP_DEADLINES.labels("failed").inc()
                        raise self._deadline_error(request, progress, retries) from None
                    retries += 1
                    metrics.STEP_DEADLINES.labels("retried").inc()
                    log.warning(
                        "step deadline passed: asking for the step's rollout again",
                        extra={
                            "step": request.step,
                            "received": progress.received,
                            "total": progress.total,
                            "missing": listed_missing(progress.missing()),
                            "retry": retries,
                        },
                    )
        finally:
            queue.put_nowait(None)

    def _deadline_error(self, request: RolloutRequest, progress: Progress, retries: int) -> StepDeadlineError:
        deadline = self.rollout.step_deadline_s
        return StepDeadlineError(
            f"step {request.step}: rollout.stepDeadlineS ({deadline:g}s) passed with "
            f"{progress.received}/{progress.total} trajectories after {retries} retries (rollout.stepRetries); "
            f"missing (prompt, sample): {listed_missing(progress.missing())}"
        )

    async def _rollout_call(self, rc: RolloutClient, request: RolloutRequest, again: bool):
        """One Rollout call; made `again` after a deadline, it waits (bounded) while the manager still drops the
        cancelled call's requests."""
        waits = 8 if again else 0
        for attempt in range(waits + 1):
            try:
                # a manager lost mid-step is waited for (connect_timeout) and re-attached to, within the deadline
                async for traj in rc.rollout(request, reattach_s=self.reattach_s):
                    yield traj
                return
            except RolloutError as err:
                if not err.step_in_progress or attempt == waits:
                    raise
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))  # back-off: the manager is ending the first call


def drain(queue: asyncio.Queue[Trajectory | None], first: Trajectory) -> tuple[list[Trajectory], bool]:
    """`first` and every trajectory already queued (one reward batch); True when the end marker was reached."""
    batch = [first]
    while not queue.empty():
        item = queue.get_nowait()
        if item is None:
            return batch, True
        batch.append(item)
    return batch, False


def listed_missing(missing: list, most: int = 10) -> str:
    """The first `most` missing (prompt, sample) pairs, and how many more."""
    more = f" and {len(missing) - most} more" if len(missing) > most else ""
    return ", ".join(map(str, missing[:most])) + more
