"""Announce new weight versions on NATS (`rlboost.<ns>.<job>.weights`, a WeightsAnnounced JSON body).

Connecting fails fast with one clear error when NATS is not reachable at start; once connected,
nats-py reconnects forever, and a publish that fails while NATS is away is logged, not raised:
workers also poll GET /v1/versions, so a lost announcement only delays them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import urlparse

import nats
from nats.aio.client import Client

from rlboost.backoff import keep_trying
from rlboost.wire.events import WEIGHTS, WeightsAnnounced

log = logging.getLogger(__name__)


class AnnounceError(Exception):
    """NATS could not be reached at start."""


class Announcer:
    """Publishes WeightsAnnounced events for one job."""

    def __init__(self, url: str, namespace: str, job: str, nats_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self._options = nats_options or {}  # user, password, TLS: rlboost.auth.nats.connect_options
        self.subject = WEIGHTS.subject(namespace, job)
        self._nc: Client | None = None

    async def connect_within(self, wait_s: float, timeout: float = 5.0) -> None:
        """Connect, trying again with back-off (0.5 s doubling to 5 s) for `wait_s` seconds: NATS may start after
        us, or its Service name may not resolve yet (a new pod's DNS); then raise the last AnnounceError."""
        await keep_trying(lambda: self.connect(timeout), AnnounceError, wait_s, log)

    async def connect(self, timeout: float = 5.0) -> None:
        """Connect or raise AnnounceError naming the URL."""
        parsed = urlparse(self.url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
        try:  # probe first: nats-py with endless reconnects would otherwise retry the first connect forever
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
            writer.close()
            await writer.wait_closed()
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.url,
                    name="weight-server",
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnect,
                    reconnected_cb=self._on_reconnect,
                    **self._options,
                ),
                timeout,
            )
        except (OSError, TimeoutError, nats.errors.Error) as err:
            raise AnnounceError(f"cannot reach NATS at {self.url}: {err or type(err).__name__}") from None
        log.info("connected to NATS", extra={"url": self.url, "subject": self.subject})

    async def announce(self, event: WeightsAnnounced) -> bool:
        """Publish; False (and a log line) when NATS is away."""
        if self._nc is None:
            return False
        try:
            await self._nc.publish(self.subject, WEIGHTS.encode(event))
            await self._nc.flush(timeout=2)
        except Exception as err:  # noqa: BLE001 (any transport failure must not fail the upload)
            log.warning("announcement not delivered", extra={"version": event.version, "error": str(err)})
            return False
        return True

    async def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            try:
                await self._nc.close()
            except (OSError, nats.errors.Error) as err:  # NATS already gone: nothing left to flush
                log.info("NATS connection closed uncleanly", extra={"error": str(err)})

    async def _on_error(self, err: Exception) -> None:
        log.warning("NATS error", extra={"error": str(err)})

    async def _on_disconnect(self) -> None:
        log.warning("NATS disconnected; reconnecting", extra={"url": self.url})

    async def _on_reconnect(self) -> None:
        log.info("NATS reconnected", extra={"url": self.url})
