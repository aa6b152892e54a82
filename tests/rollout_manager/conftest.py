"""Fixtures: a real in-process rollout-manager gRPC server on a free loopback port."""

from __future__ import annotations

import pytest

from rlboost.spec import RolloutSpec
from rollout_manager.server import RolloutManagerServer


@pytest.fixture
async def manager():
    """A running manager with short leases (heartbeat 50 ms, lease 300 ms) and balancing off."""
    server = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=50, lease_timeout_ms=300), balance_interval_s=3600.0
    )
    port = await server.start("127.0.0.1", 0)
    server.target = f"127.0.0.1:{port}"
    yield server
    await server.stop(grace=0)
