"""Suspension at a step boundary (spec.suspend, a Kueue preemption): the operator asks over NATS (topic `suspend`, a
request the trainer answers with a SuspendReply); the trainer checkpoints at the end of the step in progress, then
starts no other step and waits to be stopped. The operator scales the job to zero once the answer says so.

Why the operator asks over NATS rather than the trainer checkpointing on SIGTERM: a checkpoint is a collective save
every rank takes at the same step (rank 0 orders it in the step's OptimizerStep), and the step in progress needs its
rollouts, so the rollout workers must still run while it finishes. Only the operator can order that: checkpoint
first, then scale every child to zero. SIGTERM reaches every pod at once, the workers included, and its grace period
bounds a step that may take minutes on a large model.

Each answer describes the state, so asking again is harmless and a lost answer costs one more request. A request
that comes after the step's checkpoint decision (the optimizer step is under way) is served at the end of the next
step: still no step lost, one more taken.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from rlboost.wire.events import SUSPEND, SuspendReply

log = logging.getLogger(__name__)


class Suspension:
    """Owns: whether a suspension was asked for, the steps the newest checkpoint holds, and whether training
    stopped for good (answered `checkpointed`)."""

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""
        self.saved_steps = 0  # steps in the newest checkpoint written or resumed from (0: the model's weights)
        self.steps_done = 0
        self.weights_checksum = ""
        self.stopped = False  # no step will start: the answer is `checkpointed`
        self._forever = asyncio.Event()  # never set: a stopped trainer waits here until its pod is stopped

    async def listen(self, nc: Any, namespace: str, job: str) -> None:
        """Answer the job's suspend requests on `nc` (rank 0's NATS connection)."""
        await nc.subscribe(SUSPEND.subject(namespace, job), cb=self._on_request)

    async def _on_request(self, msg: Any) -> None:
        request = SUSPEND.decode(msg.data)
        if not self.requested:
            log.info("suspension requested: checkpoint at the step boundary", extra={"reason": request.reason})
        self.requested, self.reason = True, request.reason
        await msg.respond(self.reply().model_dump_json().encode())

    def reply(self) -> SuspendReply:
        return SuspendReply(
            checkpointed=self.stopped, steps_done=self.steps_done, weights_checksum=self.weights_checksum
        )

    def saved(self, steps: int) -> None:
        """A checkpoint holding `steps` steps was written (or resumed from)."""
        self.saved_steps = steps

    def progress(self, steps_done: int, weights_checksum: str) -> None:
        self.steps_done, self.weights_checksum = steps_done, weights_checksum

    def save_due(self) -> bool:
        """Whether the step about to checkpoint must: a suspension is pending."""
        return self.requested

    def may_stop(self) -> bool:
        """Between steps: a suspension is pending and the newest checkpoint holds every step taken."""
        return self.requested and self.saved_steps == self.steps_done

    async def stop(self) -> None:
        """Start no other step; answer `checkpointed` from now on; wait until the pod is stopped (never returns)."""
        self.stopped = True
        log.info(
            "suspended: the checkpoint holds every step taken; waiting to be stopped",
            extra={"steps_done": self.steps_done, "reason": self.reason},
        )
        await self._forever.wait()
