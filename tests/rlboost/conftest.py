"""Fixtures of tests/rlboost: a job's NATS (a real nats-server with the job's users and their permissions)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlboost.auth.credentials import JobCredentials, generate
from rlboost.auth.nats_config import passwords_of, render_nats_config
from rlboost.nats_server import NatsServer, free_port

NS, JOB = "team", "alpha"


@pytest.fixture
def job_nats(tmp_path: Path) -> Iterator[tuple[NatsServer, JobCredentials]]:
    creds = generate(tmp_path / "credentials")
    port = free_port()
    config = render_nats_config(
        passwords_of(creds), NS, JOB, listen=f"127.0.0.1:{port}", store_dir=str(tmp_path / "nats")
    )
    with NatsServer(tmp_path / "nats", port=port, config=config) as server:
        yield server, creds
