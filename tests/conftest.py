"""Shared fixtures: a real nats-server on a free loopback port, free ports, deadlines."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlboost.nats_server import NatsServer, free_port


@pytest.fixture
def nats_server(tmp_path) -> Iterator[NatsServer]:
    """A real nats-server (JetStream on) for one test."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def port() -> int:
    return free_port()
