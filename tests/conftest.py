"""Shared fixtures: a real nats-server on a free loopback port, free ports, deadlines; one model cache."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from rlboost.nats_server import NatsServer, free_port

# The fuzzers run one fixed sequence of inputs in `make test` (a failure reproduces; no run fails on a draw nobody
# can find again); HYPOTHESIS_PROFILE=explore draws new inputs each run, to look for more (two real bugs were found
# that way: see the fuzz tests' history).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One tiny-model cache for the session (every `rlboost local` the tests start inherits it): each
    distinct model is created once, and nothing is read from or written to the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as session_env:
        session_env.setenv("RLBOOST_CACHE_DIR", str(tmp_path_factory.mktemp("rlboost-cache")))
        yield


@pytest.fixture
def nats_server(tmp_path) -> Iterator[NatsServer]:
    """A real nats-server (JetStream on) for one test."""
    with NatsServer(tmp_path / "nats") as server:
        yield server


@pytest.fixture
def port() -> int:
    return free_port()
