"""Fixtures of the attacker's suite: a job's real credentials, and the real services (each as its own process)
started with them, on free loopback ports."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlboost.auth.credentials import JobCredentials, generate
from rlboost.nats_server import free_port, wait_for_port

LOOPBACK = "127.0.0.1"


@dataclass
class Service:
    proc: subprocess.Popen
    port: int
    creds: JobCredentials

    @property
    def target(self) -> str:
        return f"{LOOPBACK}:{self.port}"


def _spawn(module: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, "--host", LOOPBACK, "--nats-url", "", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _serve(module: str, creds: JobCredentials, port: int, *args: str) -> Iterator[Service]:
    proc = _spawn(module, "--port", str(port), "--credentials-dir", str(creds.directory), *args)
    try:
        wait_for_port(LOOPBACK, port, 30, proc)
        yield Service(proc, port, creds)
    finally:
        proc.terminate()
        proc.communicate(timeout=15)


@pytest.fixture
def creds(tmp_path: Path) -> JobCredentials:
    """A job's credentials as `rlboost local` makes them (no TLS)."""
    return generate(tmp_path / "credentials")


@pytest.fixture
def tls_creds(tmp_path: Path) -> JobCredentials:
    """A job's credentials as the operator makes them: with a CA and server certificates for loopback."""
    return generate(tmp_path / "tls-credentials", {"manager": [LOOPBACK], "weight-server": [LOOPBACK]})


@pytest.fixture
def manager(creds: JobCredentials) -> Iterator[Service]:
    """`python -m rollout_manager --credentials-dir ...`: short leases, no NATS."""
    yield from _serve("rollout_manager", creds, free_port(), "--metrics-port", "0")


@pytest.fixture
def weight_server(creds: JobCredentials, tmp_path: Path) -> Iterator[Service]:
    """`python -m weight_server --credentials-dir ...` without NATS."""
    yield from _serve(
        "weight_server",
        creds,
        free_port(),
        "--data-dir",
        str(tmp_path / "weights"),
        "--no-nats",
        "--chunk-bytes",
        "65536",
    )
