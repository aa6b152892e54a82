"""Fixtures: a real in-process rollout-manager gRPC server on a free loopback port."""

from __future__ import annotations

import pytest

from rlboost.spec import RolloutSpec
from rollout_manager.server import RolloutManagerServer

from .client import SAFETY_LEASE_MS


@pytest.fixture
async def manager():
    """A running manager with balancing off, heartbeats every 50 ms and a lease that is only a safety net
    (client.SAFETY_LEASE_MS: no machine load expires a live worker; tests of expiry drive a ManualClock)."""
    server = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=50, lease_timeout_ms=SAFETY_LEASE_MS), balance_interval_s=3600.0
    )
    port = await server.start("127.0.0.1", 0)
    server.target = f"127.0.0.1:{port}"
    yield server
    await server.stop(grace=0)
