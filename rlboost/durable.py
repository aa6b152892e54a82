"""NATS messages that must arrive (step reports, `done`): published to JetStream and re-sent until acknowledged.

A stream that keeps the subject (the job's status stream: the operator's on Kubernetes, `rlboost local`'s
locally) answers each publish with an acknowledgement once the message is on its disk, so a message published
while NATS restarts or the client reconnects is sent again until it is stored, with bounded back-off (and
stored once: every copy carries one message id). Where no stream keeps the subject (a bare nats-server in a unit
test) the publish reached the plain subscribers, if any, as before: no stream answers, so nothing is re-sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client
from nats.js.errors import NoStreamResponseError

log = logging.getLogger(__name__)

ACK_TIMEOUT_S = 2.0
RESEND_FOR_S = 120.0  # give up (raise) when no acknowledgement came for this long
FIRST_PAUSE_S, MAX_PAUSE_S = 0.2, 2.0


def reconnect_quietly(
    logger: logging.Logger, level: int = logging.WARNING
) -> dict[str, Callable[..., Awaitable[None]]]:
    """nats.connect callbacks that log a lost connection once per outage: its first error at `level`, the attempts
    after it at DEBUG, the reconnect at `level` with how long NATS was away. nats-py's default prints
    a traceback on every attempt, and one line per attempt is still two a second for as long as NATS is away: the
    operator's link to a job suspended for hours in a Kueue queue logged 258 in 4 minutes (the cluster lane)."""
    away_since: list[float] = []  # when the outage began; empty while connected

    def first_of_outage() -> bool:
        if away_since:
            return False
        away_since.append(time.monotonic())
        return True

    async def on_error(err: Exception) -> None:
        first = first_of_outage()
        logger.log(level if first else logging.DEBUG, "NATS connection error; reconnecting", extra={"error": repr(err)})

    async def on_disconnected() -> None:  # also on the client's own close: the error that comes with a loss speaks
        logger.debug("NATS disconnected")

    async def on_reconnected() -> None:
        away_s = round(time.monotonic() - away_since.pop(), 3) if away_since else 0.0
        logger.log(level, "NATS reconnected", extra={"away_s": away_s})

    return {"error_cb": on_error, "disconnected_cb": on_disconnected, "reconnected_cb": on_reconnected}


class NotAcknowledgedError(RuntimeError):
    """No stream acknowledged the message within the bound."""


class AcknowledgedPublisher:
    """Publishes on one connection; remembers whether a stream has acknowledged anything on it yet."""

    def __init__(self, nc: Client, resend_for_s: float = RESEND_FOR_S) -> None:
        self.nc, self.resend_for_s = nc, resend_for_s
        self.stream_seen = False  # once a stream acknowledged, a silent NATS means "away", never "no stream"
        self.no_stream = False  # a connected NATS stayed silent before any acknowledgement: publish plainly

    async def publish(self, subject: str, data: bytes) -> bool:
        """Publish until a stream acknowledges (True); False when no stream keeps `subject`: NATS answers "no
        responders", or, before any acknowledgement, a connected NATS stays silent (only plain subscribers
        listen, and they got the message; later messages then go plainly, without waiting for an answer)."""
        if self.no_stream:
            await self.nc.publish(subject, data)
            await self.nc.flush(timeout=ACK_TIMEOUT_S)
            return False
        js = self.nc.jetstream(timeout=ACK_TIMEOUT_S)
        deadline, pause = time.monotonic() + self.resend_for_s, FIRST_PAUSE_S
        # One id for every copy: an attempt that timed out while NATS was away may still be delivered from the
        # client's buffer after the reconnect, and the stream stores a message id once (its duplicate window).
        headers = {"Nats-Msg-Id": uuid.uuid4().hex}
        while True:
            connected = self.nc.is_connected
            try:
                await js.publish(subject, data, headers=headers)
                self.stream_seen = True
                return True
            except (nats.errors.NoRespondersError, NoStreamResponseError) as e:
                if connected and self.nc.is_connected:  # connected, and nothing listened to the request
                    await self._publish_plainly(subject, data)
                    return False
                err: Exception = e
            except TimeoutError as e:
                if not self.stream_seen and connected and self.nc.is_connected:
                    log.info("no stream keeps these messages: publishing them plainly", extra={"subject": subject})
                    self.no_stream = True
                    return False
                err = e
            except nats.errors.Error as e:  # NATS away or restarting: send again
                err = e
            if time.monotonic() + pause > deadline:
                raise NotAcknowledgedError(f"no acknowledgement for {subject} within {self.resend_for_s:.0f}s: {err!r}")
            log.warning("NATS did not acknowledge; sending again", extra={"subject": subject, "error": repr(err)})
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)

    async def _publish_plainly(self, subject: str, data: bytes) -> None:
        """A plain copy after NATS answered "no responders". That answer is not final for a subscriber that has
        just subscribed: against a real nats-server, 2 of 25 publishes right after a subscriber's SUB was
        flushed got "no responders" (cause not found) and the subscriber never got the message; a plain copy
        sent at once reached it (2 of 2). Where nothing listens, the copy is dropped as the request was."""
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await self.nc.publish(subject, data)
            await self.nc.flush(timeout=ACK_TIMEOUT_S)
