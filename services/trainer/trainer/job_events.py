"""The trainer's NATS connection and the job events it must deliver: each step's report and `done`, sent again
until the job's status stream acknowledges them (rlboost.durable). Rank 0 only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, TypeVar

from rlboost.wire.events import DONE, STEPS, TRAINER_INBOX, JobDone, StepReport, Topic

log = logging.getLogger(__name__)

Event = TypeVar("Event", StepReport, JobDone)


class JobEvents:
    """Connects to NATS (as user `trainer` with the job's credentials) and publishes the job's events."""

    def __init__(self, nats_url: str, namespace: str, job: str, credentials_dir: str, connect_timeout_s: float) -> None:
        self.nats_url, self.namespace, self.job = nats_url, namespace, job
        self.credentials_dir, self.connect_timeout_s = credentials_dir, connect_timeout_s  # '' : anonymous
        self.nc: Any = None  # the connection (colocation talks over it too); None until connected
        self._publisher: Any = None  # rlboost.durable.AcknowledgedPublisher on nc

    async def connect(self) -> None:
        import nats

        from rlboost.auth.nats import connect_options
        from rlboost.durable import AcknowledgedPublisher, reconnect_quietly

        try:
            self.nc = await asyncio.wait_for(
                nats.connect(
                    self.nats_url,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    inbox_prefix=TRAINER_INBOX,  # the status stream's acknowledgements (rlboost.durable)
                    **reconnect_quietly(log),
                    **connect_options(self.credentials_dir, "trainer"),
                ),
                self.connect_timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.NoServersError) as err:
            raise RuntimeError(f"cannot reach NATS at {self.nats_url}: {err or type(err).__name__}") from None
        self._publisher = AcknowledgedPublisher(self.nc)

    async def publish(self, topic: Topic[Event], event: Event) -> None:
        """Step reports (STEPS) and `done` (DONE) must arrive: sent again until the job's status stream
        acknowledges them."""
        assert topic in (STEPS, DONE), topic.name
        if self._publisher is None:
            return
        await self._publisher.publish(topic.subject(self.namespace, self.job), topic.encode(event))

    async def close(self) -> None:
        """Drain the connection (best effort, bounded)."""
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.drain(), 5)
