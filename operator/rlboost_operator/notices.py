"""NATS publisher of preemption notices (rlboost.wire.events.PreemptionNotice on `<ns>.<job>.nodes`)
and subscriber of the job's step reports, for the operator: one link per job, to that job's own NATS, as its
user `operator` (the only user that may publish notices).

The connection is opened lazily and retried, so the operator runs (and reconciles) while NATS is down.

A preemption notice must arrive: it is sent as a request, and the rollout-manager acknowledges it once it has
marked the workers draining. Without an acknowledgement (no manager subscribed: it is restarting; NATS
reconnecting) it is sent again, with back-off, until one comes or the notice's own deadline has passed (the node
is gone by then). Draining is idempotent at the manager, so a notice that arrived but whose acknowledgement was
lost costs nothing when it comes again.

Status survives the operator: step reports and `done` are kept by a JetStream stream (`STATUS_STREAM`, the
newest message per job and topic), and the operator reads them through a consumer that starts with that
newest message. An operator that was down (restarted, upgraded, a new leader) while a step finished or the
job ended still writes it to the RLJob when it comes back. Against a NATS without JetStream it falls back
to plain subscriptions (live messages only) and says so in its log. A kept message older than the RLJob
(`since`: its creationTimestamp) is from an earlier RLJob of the same name and is skipped: a new job must not
start out Succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from rlboost.durable import reconnect_quietly
from rlboost.wire.events import NODES, STATUS_STREAM, STATUS_TOPICS, PreemptionNotice, Topic

log = logging.getLogger(__name__)

NOTICE_ACK_TIMEOUT_S = 2.0  # one delivery attempt: the manager acknowledges as soon as it marked the workers
NOTICE_MIN_RESEND_S = 10.0  # re-send for at least this long, even for a notice with a shorter deadline


def status_stream_config() -> StreamConfig:
    """The newest step report and `done` of every job, on disk, for a week after the job's last message."""
    return StreamConfig(
        name=STATUS_STREAM,
        subjects=[topic.subject("*", "*") for topic in STATUS_TOPICS],
        max_msgs_per_subject=1,
        max_age=7 * 24 * 3600,
        storage=StorageType.FILE,
    )


class NatsLink:
    """One connection to a job's NATS, shared by the operator's publisher and subscribers of that job; `options`:
    nats.connect's user, password and TLS (rlboost.auth.nats.client_options)."""

    def __init__(self, url: str, connect_timeout: float = 2.0, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self.options = options or {}
        self._nc: Client | None = None
        self._lock = asyncio.Lock()
        self._resending: set[asyncio.Task] = set()  # notices not yet acknowledged, being re-sent

    async def client(self) -> Client:
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                # nats-py with endless reconnects retries a first connect forever: bounded here, so a job whose
                # NATS is not up yet costs its handler a retry, not a hang
                self._nc = await asyncio.wait_for(
                    nats.connect(
                        self.url,
                        connect_timeout=self.connect_timeout,
                        max_reconnect_attempts=-1,
                        allow_reconnect=True,
                        **reconnect_quietly(log),  # a suspended job's NATS is away for as long as it waits
                        **self.options,
                    ),
                    3 * self.connect_timeout,
                )
            return self._nc

    async def publish_notice(self, namespace: str, job: str, notice: PreemptionNotice) -> bool:
        """Send the notice and wait for the manager's acknowledgement once; without one, keep re-sending it in the
        background until acknowledged or past its deadline. True: acknowledged at the first attempt."""
        nc = await self.client()
        subj, data = NODES.subject(namespace, job), NODES.encode(notice)
        if await _acknowledged(nc, subj, data):
            return True
        task = asyncio.create_task(self._resend(nc, subj, data, notice))
        self._resending.add(task)  # a reference: a task nobody holds may be collected mid-way
        task.add_done_callback(self._resending.discard)
        return False

    async def _resend(self, nc: Client, subj: str, data: bytes, notice: PreemptionNotice) -> None:
        """Re-send until acknowledged or `deadline_s` (at least NOTICE_MIN_RESEND_S) has passed; back-off between."""
        give_up_at = time.monotonic() + max(notice.deadline_s, NOTICE_MIN_RESEND_S)
        pause, attempts = 0.2, 1
        while time.monotonic() + pause < give_up_at:
            await asyncio.sleep(pause)  # back-off between attempts, not synchronisation
            pause, attempts = min(pause * 2, 5.0), attempts + 1
            if await _acknowledged(nc, subj, data):
                log.info("preemption notice acknowledged", extra={"node": notice.node, "attempts": attempts})
                return
        log.warning(
            "preemption notice never acknowledged: no rollout-manager answered before its deadline",
            extra={"node": notice.node, "attempts": attempts, "deadline_s": notice.deadline_s},
        )

    async def ensure_status_stream(self) -> bool:
        """Create (or bring up to date) the stream that keeps job status; False when NATS has no JetStream."""
        js = (await self.client()).jetstream(timeout=self.connect_timeout)
        config = status_stream_config()
        try:
            try:
                await js.update_stream(config)
            except NotFoundError:
                await js.add_stream(config)
        except (NotFoundError, BadRequestError, nats.errors.NoRespondersError, TimeoutError) as err:
            log.warning(
                "NATS has no usable JetStream: RLJob status follows live messages only", extra={"error": str(err)}
            )
            return False
        return True

    async def subscribe(
        self,
        namespace: str,
        job: str,
        topic: Topic[Any],
        handler: Callable[[bytes], Awaitable[None]],
        since: datetime | None = None,
    ):
        """Subscribe to the job's topic; returns the subscription (unsubscribe it when done).

        A status topic replays its newest kept message first (then every new one), when the stream exists; one
        published before `since` is skipped."""
        nc = await self.client()

        async def on_msg(msg: Msg) -> None:
            if since is not None and _published_before(msg, since):
                log.info(
                    "skipped a %s message older than the job", topic.name, extra={"job": job, "namespace": namespace}
                )
                return
            try:
                await handler(msg.data)
            except Exception:  # one bad message must not end the subscription
                log.exception("handling a %s message failed", topic.name, extra={"job": job, "namespace": namespace})

        subj = topic.subject(namespace, job)
        if topic in STATUS_TOPICS and await self.ensure_status_stream():
            js = nc.jetstream(timeout=self.connect_timeout)
            sub = await js.subscribe(
                subj,
                stream=STATUS_STREAM,  # named: no stream lookup, which the job's NATS does not allow the operator
                cb=on_msg,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            )
        else:
            sub = await nc.subscribe(subj, cb=on_msg)
        await nc.flush(timeout=self.connect_timeout)
        return sub

    async def close(self) -> None:
        for task in list(self._resending):
            task.cancel()
        if self._nc is not None and not self._nc.is_closed:
            await self._nc.drain()
        self._nc = None


async def _acknowledged(nc: Client, subj: str, data: bytes) -> bool:
    """One attempt: publish as a request; True when a subscriber (the manager) answered in time."""
    try:
        await nc.request(subj, data, timeout=NOTICE_ACK_TIMEOUT_S)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.errors.ConnectionClosedError):
        return False
    return True


def _published_before(msg: Msg, since: datetime) -> bool:
    """Whether a JetStream message was stored before `since` (a plain NATS message carries no time: False)."""
    try:
        return msg.metadata.timestamp < since
    except Exception:  # not a JetStream message
        return False
