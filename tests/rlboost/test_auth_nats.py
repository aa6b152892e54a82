"""A job's NATS users against a real nats-server running rlboost.auth.nats_config's configuration: anonymous
clients are refused, each role is refused what it has no right to (the audit's forged drain notice, forged
step reports, a wildcard read of another job), and every flow the services use goes through."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import nats
import pytest

from rlboost.auth.credentials import JobCredentials, generate
from rlboost.auth.nats import connect_options
from rlboost.auth.nats_config import PUBLISHERS, SUBSCRIBERS, passwords_of, render_nats_config
from rlboost.wire.events import NODES, STATUS_STREAM, STEPS, TOPICS, WEIGHTS
from tests.rlboost.conftest import JOB, NS

RECEIVE_S = 1.0  # how long a denied message is given to arrive anyway (it must not)
DELIVER_S = 15.0  # the deadline of an allowed message (returns as soon as it arrives; generous under load)
BY_NAME = {t.name: t for t in TOPICS}


async def _client(url: str, creds: JobCredentials, user: str, errors: list[str] | None = None):
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    options = connect_options(creds.directory, user)
    return await nats.connect(url, connect_timeout=2, allow_reconnect=False, error_cb=on_error, **options)


async def _delivered(
    url: str, creds: JobCredentials, publisher: str, subscriber: str, subj: str, wait_s: float = RECEIVE_S
) -> tuple[bool, list]:
    """Whether `subscriber` got a message `publisher` sent on `subj`; and the permission errors either saw."""
    errors: list[str] = []
    sub_nc = await _client(url, creds, subscriber, errors)
    pub_nc = await _client(url, creds, publisher, errors)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_msg(msg) -> None:
        await got.put(msg.data)

    try:
        await sub_nc.subscribe(subj, cb=on_msg)
        await sub_nc.flush()
        # Re-sent every RECEIVE_S until `wait_s`: an allowed message must arrive, and one send can be missed while
        # the server is still setting up the subscription's permissions on a loaded machine.
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            await pub_nc.publish(subj, b"{}")
            await pub_nc.flush()
            try:
                await asyncio.wait_for(got.get(), RECEIVE_S)
                return True, errors
            except TimeoutError:
                if asyncio.get_running_loop().time() >= deadline:
                    return False, errors
    finally:
        await pub_nc.close()
        await sub_nc.close()


def _raw_connect(port: int, connect: dict) -> bytes:
    """The server's answer to CONNECT + PING on a bare socket (nats-py leaves a refused connection's transport
    open, which this suite's warnings-as-errors would report)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        stream = sock.makefile("rb")
        assert stream.readline().startswith(b"INFO ")
        sock.sendall(b"CONNECT " + json.dumps({"verbose": False, **connect}).encode() + b"\r\nPING\r\n")
        return stream.readline()


def test_anonymous_and_wrong_password_clients_are_refused(job_nats) -> None:
    server, creds = job_nats
    for connect in ({}, {"user": "worker", "pass": "guess"}, {"user": "nobody", "pass": creds.nats_password("worker")}):
        assert b"Authorization Violation" in _raw_connect(server.port, connect), connect
    assert _raw_connect(server.port, {"user": "worker", "pass": creds.nats_password("worker")}) == b"PONG\r\n"


@pytest.mark.parametrize(
    ("topic", "publisher", "subscriber"),
    [(topic.name, users[0], SUBSCRIBERS[topic][0]) for topic, users in PUBLISHERS.items()],
)
def test_every_flow_the_services_use_is_delivered(job_nats, topic: str, publisher: str, subscriber: str) -> None:
    server, creds = job_nats
    subj = BY_NAME[topic].subject(NS, JOB)
    ok, errors = asyncio.run(_delivered(server.url, creds, publisher, subscriber, subj, DELIVER_S))
    assert ok and not errors, errors


@pytest.mark.parametrize(
    ("topic", "forger"),
    [
        ("nodes", "worker"),  # the audit's forged drain notice
        ("nodes", "trainer"),
        ("steps", "worker"),  # only the trainer reports steps
        ("steps", "observer"),
        ("done", "weight-server"),
        ("colocation", "worker"),  # a worker cannot make a reserved worker release its engine
        ("weights", "trainer"),
    ],
)
def test_a_role_cannot_publish_another_roles_subject(job_nats, topic: str, forger: str) -> None:
    server, creds = job_nats
    subscriber = SUBSCRIBERS[BY_NAME[topic]][0]
    ok, errors = asyncio.run(_delivered(server.url, creds, forger, subscriber, BY_NAME[topic].subject(NS, JOB)))
    assert not ok
    assert any("permissions violation for publish" in e.lower() for e in errors), errors


@pytest.mark.parametrize(
    ("subscriber", "subj"),
    [
        ("observer", "rlboost.>"),  # the audit's wildcard read of every job
        ("worker", WEIGHTS.subject(NS, "other-job")),
        ("worker", NODES.subject(NS, JOB)),
        ("manager", STEPS.subject(NS, JOB)),
        ("trainer", "_INBOX.>"),
    ],
)
def test_a_role_cannot_read_outside_its_rights(job_nats, subscriber: str, subj: str) -> None:
    server, creds = job_nats
    errors: list[str] = []

    async def run() -> None:
        nc = await _client(server.url, creds, subscriber, errors)
        await nc.subscribe(subj)
        await nc.flush()
        deadline = asyncio.get_running_loop().time() + RECEIVE_S  # the error callback runs after the -ERR is read
        while not errors and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        await nc.close()

    asyncio.run(run())
    assert any("permissions violation for subscription" in e.lower() for e in errors), errors


def test_only_the_operator_uses_the_status_stream(job_nats) -> None:
    server, creds = job_nats

    async def add_stream(user: str) -> None:
        nc = await _client(server.url, creds, user)
        try:
            await nc.jetstream(timeout=2).add_stream(name=STATUS_STREAM, subjects=[STEPS.subject(NS, JOB)])
        finally:
            await nc.close()

    asyncio.run(add_stream("operator"))
    with pytest.raises((nats.errors.Error, TimeoutError)):
        asyncio.run(add_stream("worker"))


def test_configuration_is_json_with_tls_when_asked(tmp_path: Path) -> None:
    from rlboost.auth.nats_config import NatsTls

    creds = generate(tmp_path / "c")
    tls = NatsTls("/c/tls-nats.crt", "/c/tls-nats.key", "/c/ca.crt")
    config = json.loads(
        render_nats_config(passwords_of(creds), NS, JOB, listen="0.0.0.0:4222", store_dir="/d", tls=tls)
    )
    assert config["tls"]["cert_file"] == "/c/tls-nats.crt"
    manager = next(u for u in config["authorization"]["users"] if u["user"] == "manager")
    assert manager["permissions"]["publish"] == {"deny": [">"]}
    with pytest.raises(ValueError, match="observer"):
        render_nats_config({"operator": "x"}, NS, JOB, listen="x", store_dir="/d")


def test_every_topic_has_its_publishers_and_subscribers() -> None:
    assert list(PUBLISHERS) == list(SUBSCRIBERS) == list(TOPICS)
