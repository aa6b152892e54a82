"""NATS publisher of preemption notices (rlboost.wire.events.PreemptionNotice on `<ns>.<job>.nodes`)
and subscriber of the job's step reports, for the operator.

The connection is opened lazily and retried, so the operator runs (and reconciles) while NATS is down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg

from rlboost.wire.events import PreemptionNotice, subject

log = logging.getLogger(__name__)


class NatsLink:
    """One NATS connection shared by the operator's publishers and subscribers."""

    def __init__(self, url: str, connect_timeout: float = 2.0) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self._nc: Client | None = None
        self._lock = asyncio.Lock()

    async def client(self) -> Client:
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                self._nc = await nats.connect(
                    self.url, connect_timeout=self.connect_timeout, max_reconnect_attempts=-1, allow_reconnect=True
                )
            return self._nc

    async def publish_notice(self, namespace: str, job: str, notice: PreemptionNotice) -> None:
        """Publish and flush, so the notice has left before the caller moves on."""
        nc = await self.client()
        await nc.publish(subject(namespace, job, "nodes"), notice.model_dump_json().encode())
        await nc.flush(timeout=self.connect_timeout)

    async def subscribe(self, namespace: str, job: str, topic: str, handler: Callable[[bytes], Awaitable[None]]):
        """Subscribe to the job's topic; returns the subscription (unsubscribe it when done)."""
        nc = await self.client()

        async def on_msg(msg: Msg) -> None:
            try:
                await handler(msg.data)
            except Exception:  # one bad message must not end the subscription
                log.exception("handling a %s message failed", topic, extra={"job": job, "namespace": namespace})

        sub = await nc.subscribe(subject(namespace, job, topic), cb=on_msg)
        await nc.flush(timeout=self.connect_timeout)
        return sub

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self._nc = None
