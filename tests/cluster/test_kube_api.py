"""The lane's Kubernetes API server (scripts/cluster/kube_api.py: kmock's emulator), served for real on loopback."""

from __future__ import annotations

import asyncio

import httpx
import kmock
from kube_api import BUILTIN, KEEP_REQUESTS, LaneEmulator, register


def test_a_long_run_keeps_only_the_newest_requests_and_still_answers_each() -> None:
    """kmock scans every request it recorded to dispatch the next one: a lane run of tens of thousands of requests
    made each call take seconds. The lane's emulator keeps the newest few, and every request still gets its own
    answer (the one being handled is among them)."""

    async def main() -> tuple[int, int, set[str]]:
        async with LaneEmulator() as emulator, kmock.Server(emulator, host="127.0.0.1", port=0) as server:
            register(emulator, BUILTIN)
            url = str(server.url).rstrip("/")
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                names = [f"cm-{i}" for i in range(300)]
                for name in names:
                    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"n": name}}
                    created = await client.post("/api/v1/namespaces/default/configmaps", json=body)
                    assert created.status_code in (200, 201), created.text
                got = await client.get(f"/api/v1/namespaces/default/configmaps/{names[-1]}")
                listed = await client.get("/api/v1/namespaces/default/configmaps")
            seen = {item["metadata"]["name"] for item in listed.json()["items"]}
            return len(emulator._requests), got.json()["data"]["n"] == names[-1], seen == set(names)

    recorded, answered, all_listed = asyncio.run(main())
    assert recorded <= 2 * KEEP_REQUESTS  # of 302 served
    assert answered and all_listed
