"""Messages that must arrive (step reports, `done`) against a real nats-server with the job's users: published
by the trainer until the status stream acknowledges them, read back in order by `rlboost local`, across a
SIGKILL and restart of NATS (JetStream keeps the stream on disk), each exactly once."""

from __future__ import annotations

import asyncio
import logging

import nats

from rlboost.auth.credentials import JobCredentials
from rlboost.auth.nats import connect_options
from rlboost.durable import AcknowledgedPublisher
from rlboost.local.status_stream import StreamCursor, ensure_status_stream, read_from
from rlboost.nats_server import NatsServer
from rlboost.wire.events import DONE, STEPS, TRAINER_INBOX
from tests.rlboost.conftest import JOB, NS

READ_S = 15.0  # deadline of reading back what was acknowledged (returns as soon as it is all there)


async def _connect(server: NatsServer, creds: JobCredentials, user: str, **extra: object):
    options = connect_options(creds.directory, user)
    return await nats.connect(
        server.url,
        connect_timeout=2,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        error_cb=_ignore,
        **extra,
        **options,
    )


async def _ignore(_: Exception) -> None:  # reconnect attempts while the server is down
    return None


async def _read(nc, cursor: StreamCursor, want: int) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    deadline = asyncio.get_running_loop().time() + READ_S
    while len(got) < want and asyncio.get_running_loop().time() < deadline:
        got += await read_from(nc, cursor)
        if len(got) < want:
            await asyncio.sleep(0.05)  # polling the stream (what the local run does every tick)
    return got


def test_acknowledged_messages_survive_a_nats_restart_once_each(job_nats) -> None:
    server, creds = job_nats
    steps, done = STEPS.subject(NS, JOB), DONE.subject(NS, JOB)

    async def main() -> list[tuple[str, bytes]]:
        operator = await _connect(server, creds, "operator")
        trainer = await _connect(server, creds, "trainer", inbox_prefix=TRAINER_INBOX)
        try:
            cursor = await ensure_status_stream(operator, NS, JOB)
            events = AcknowledgedPublisher(trainer)
            assert await events.publish(steps, b"step 0")
            server.proc.kill()  # SIGKILL: nothing flushed
            server.proc.wait()
            server.stop()
            sent = asyncio.create_task(events.publish(steps, b"step 1"))  # while NATS is away
            server.start()
            assert await asyncio.wait_for(sent, 60)
            assert await events.publish(done, b"done")
            got = await _read(operator, cursor, 3)
            # A later run of the same run dir (a resumed job) starts after what the stream holds.
            later = await ensure_status_stream(operator, NS, JOB)
            return got + await read_from(operator, later)
        finally:
            await trainer.close()
            await operator.close()

    got = asyncio.run(main())
    assert got == [(steps, b"step 0"), (steps, b"step 1"), (done, b"done")]


def test_without_a_stream_the_message_is_published_plainly(job_nats) -> None:
    server, creds = job_nats
    steps = STEPS.subject(NS, JOB)

    async def main() -> tuple[bool, bytes]:
        observer = await _connect(server, creds, "observer")
        trainer = await _connect(server, creds, "trainer", inbox_prefix=TRAINER_INBOX)
        got: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_msg(msg) -> None:
            await got.put(msg.data)

        try:
            await observer.subscribe(steps, cb=on_msg)
            await observer.flush()
            stored = await AcknowledgedPublisher(trainer).publish(steps, b"step 0")
            return stored, await asyncio.wait_for(got.get(), READ_S)
        finally:
            await trainer.close()
            await observer.close()

    assert asyncio.run(main()) == (False, b"step 0")


def test_a_nats_outage_is_logged_once_then_its_end(job_nats) -> None:
    """reconnect_quietly: while NATS is away (SIGKILLed, then started again) a client retrying every 0.1 s logs the
    outage once at WARNING and every further attempt at DEBUG, then the reconnect with how long it was away."""
    server, creds = job_nats
    records: list[logging.LogRecord] = []
    logger = logging.getLogger("tests.durable.outage")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(_Collect(records))

    async def wait_for(condition, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + READ_S
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.05)  # polling what the callbacks logged

    async def main() -> None:
        nc = await _connect_quietly(server, creds, logger)
        try:
            server.proc.kill()
            server.proc.wait()
            server.stop()
            await wait_for(lambda: sum(r.levelno == logging.DEBUG for r in records) >= 5, "no retries seen")
            server.start()
            await wait_for(lambda: any(r.getMessage() == "NATS reconnected" for r in records), "no reconnect")
        finally:
            await nc.close()

    asyncio.run(main())
    loud = [r for r in records if r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in loud]
    assert said == ["NATS connection error; reconnecting", "NATS reconnected"], said  # the outage, and its end
    assert loud[-1].away_s > 0


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def _connect_quietly(server: NatsServer, creds: JobCredentials, logger: logging.Logger):
    from rlboost.durable import reconnect_quietly

    options = connect_options(creds.directory, "observer")
    return await nats.connect(
        server.url,
        connect_timeout=2,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        **reconnect_quietly(logger),
        **options,
    )
