"""Preemption notices from NATS: drain the workers they name before their node goes away.

Subscribes to `rlboost.<ns>.<job>.nodes` (rlboost.wire.events.PreemptionNotice as JSON). Matching
workers are marked draining and sent DrainCommand; their requests migrate with every token when
their streams end (or when they flush them as aborted chunks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from rlboost.backoff import keep_trying
from rlboost.wire.events import NODES

from . import metrics

log = logging.getLogger(__name__)


class NatsUnavailableError(ConnectionError):
    """The NATS server could not be reached."""


def handle_notice(data: bytes, drain: Callable[[str, list[str], str], list[str]]) -> list[str]:
    """Parse one notice and drain the workers it names; a bad payload is logged and counted, not raised."""
    try:
        notice = NODES.decode(data)
    except ValidationError as err:
        metrics.PREEMPTION_NOTICES.labels("invalid").inc()
        log.warning("invalid preemption notice ignored", extra={"error": str(err).splitlines()[0]})
        return []
    matched = drain(notice.node, notice.workers, notice.reason or "preemption")
    metrics.PREEMPTION_NOTICES.labels("matched" if matched else "no_match").inc()
    log.info("preemption notice", extra={"node": notice.node, "workers": notice.workers, "drained": matched})
    return matched


class PreemptionSubscriber:
    """A NATS connection subscribed to the job's `nodes` subject."""

    def __init__(
        self,
        url: str,
        namespace: str,
        job: str,
        drain: Callable[[str, list[str], str], list[str]],
        on_change: Callable[[], None] = lambda: None,
        nats_options: dict[str, Any] | None = None,
    ) -> None:
        self.url, self.subject = url, NODES.subject(namespace, job)
        self._options = nats_options or {}  # user, password, TLS: rlboost.auth.nats.connect_options
        self._drain, self._on_change = drain, on_change
        self._nc = None

    async def start(self, connect_timeout: float = 3.0, wait_s: float = 0.0) -> None:
        """Subscribe; NATS may come up (or its name resolve) up to `wait_s` seconds late: tried with back-off."""
        await keep_trying(lambda: self._start(connect_timeout), NatsUnavailableError, wait_s, log)

    async def _start(self, connect_timeout: float) -> None:
        import nats  # lazy: only the entry point and tests need it
        from nats.errors import NoServersError

        async def _quiet(_: Exception) -> None:  # reconnect noise after a successful start
            pass

        try:  # probe once without retries, so an unreachable NATS is one clear error at start-up
            probe = await nats.connect(
                self.url,
                connect_timeout=connect_timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=_quiet,
                **self._options,
            )
            await probe.close()
        except (NoServersError, OSError, TimeoutError) as err:
            raise NatsUnavailableError(f"cannot reach NATS at {self.url}: {err or type(err).__name__}") from None
        # the long-lived connection rides out NATS restarts
        self._nc = await nats.connect(
            self.url,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            error_cb=_quiet,
            **self._options,
        )
        await self._nc.subscribe(self.subject, cb=self._on_msg)
        await self._nc.flush()

    async def _on_msg(self, msg) -> None:
        if handle_notice(msg.data, self._drain):
            self._on_change()
        if msg.reply:  # the operator re-sends a notice until acknowledged: acknowledge once the workers are marked
            await msg.respond(b"ok")

    async def stop(self) -> None:
        if self._nc is not None:
            await self._nc.close()
