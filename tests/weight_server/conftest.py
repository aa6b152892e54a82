"""Fixtures of the weight-server tests: the real app on a loopback port (servers.ThreadServer), and a client."""

from __future__ import annotations

import httpx
import pytest

from tests.weight_server.servers import ThreadServer


@pytest.fixture
def server(tmp_path):
    with ThreadServer(tmp_path / "data", chunk_bytes=4096, retain=3) as srv:
        yield srv


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=10) as c:
        yield c
