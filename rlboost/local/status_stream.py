"""The job's status stream of a local run: every step report and `done`, on NATS's disk, read back in order.

The trainer publishes them acknowledged (rlboost.durable), so none is lost to a NATS restart; `rlboost local`
(the local run's operator) creates the stream and reads it by sequence number, so a reconnect or a restart of
NATS between two reads skips nothing and repeats nothing. On Kubernetes the operator keeps its own stream of
the same name (rlboost_operator.notices).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from rlboost.wire.events import DONE, STATUS_STREAM, STEPS

log = logging.getLogger(__name__)
TOPICS = (STEPS, DONE)
TIMEOUT_S = 2.0


def local_stream_config(namespace: str, job: str) -> StreamConfig:
    """This job's step reports and `done`, all of them (a local run's stream lives as long as its run dir)."""
    return StreamConfig(
        name=STATUS_STREAM, subjects=[t.subject(namespace, job) for t in TOPICS], storage=StorageType.FILE
    )


async def ensure_status_stream(nc: Client, namespace: str, job: str) -> StreamCursor:
    """Create the stream, or keep the one an earlier run of this run dir made (`--resume`); the cursor starts
    after what the stream holds already, so an earlier run's step reports and `done` are not taken for this one's."""
    js = nc.jetstream(timeout=TIMEOUT_S)
    config = local_stream_config(namespace, job)
    try:
        info = await js.add_stream(config)
    except BadRequestError:  # it exists (with another config): bring it up to date
        info = await js.update_stream(config)
    last_step = await _last_step(nc, namespace, job) if info.state.last_seq else None
    return StreamCursor(next_seq=info.state.last_seq + 1, last_step_before=last_step)


async def _last_step(nc: Client, namespace: str, job: str) -> int | None:
    """The step of the last step report an earlier run of this run dir stored, if any."""
    try:
        msg = await nc.jetstream(timeout=TIMEOUT_S).get_last_msg(STATUS_STREAM, STEPS.subject(namespace, job))
        return STEPS.decode(msg.data or b"").step
    except (NotFoundError, ValueError):  # no step report yet, or one this version cannot read
        return None


@dataclass
class StreamCursor:
    """The sequence number of the next message to read, and what an earlier run of the run dir got."""

    next_seq: int = 1
    # A resumed trainer sends its checkpoint's step report again when no mark says it went out (it may have been
    # killed between publishing and marking): when that step is the last one the stream holds, the earlier run
    # showed it already, and this one does not count it as its own.
    last_step_before: int | None = None


async def read_from(nc: Client, cursor: StreamCursor, limit: int = 256) -> list[tuple[str, bytes]]:
    """(subject, data) of each message from the cursor on, advancing it; [] while NATS is away."""
    js = nc.jetstream(timeout=TIMEOUT_S)
    out: list[tuple[str, bytes]] = []
    while len(out) < limit:
        try:
            msg = await js.get_msg(STATUS_STREAM, seq=cursor.next_seq, subject=">", next=True)
        except NotFoundError:  # nothing stored from there on yet
            break
        except (TimeoutError, nats.errors.Error) as err:  # NATS away or restarting: read on a later tick
            log.debug("status stream not readable now", extra={"error": repr(err)})
            break
        cursor.next_seq = (msg.seq or cursor.next_seq) + 1
        out.append((msg.subject or "", msg.data or b""))
    return out
