"""The colocation-ack keys the manager hands out in Registered (rlboost.auth.colocation_acks), over real gRPC:
a reserved worker gets its own id's key, a spot worker none, and a manager without credentials gives none."""

from __future__ import annotations

import functools

from rlboost.auth.colocation_acks import worker_ack_key
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rollout_manager.server import RolloutManagerServer
from tests.rollout_manager.client import WorkerClient

KEY, JOB = b"the-jobs-colocation-key", "demo"


async def _registered(ack_keys) -> dict[str, str]:
    """Each worker id's Registered.colocation_ack_key from a manager given `ack_keys`."""
    server = RolloutManagerServer(RolloutSpec(), balance_interval_s=3600.0, colocation_ack_key=ack_keys)
    target = f"127.0.0.1:{await server.start('127.0.0.1', 0)}"
    clients = [
        WorkerClient(target, "reserved-0", pool=pb.POOL_RESERVED),
        WorkerClient(target, "reserved-1", pool=pb.POOL_RESERVED),
        WorkerClient(target, "spot-0", pool=pb.POOL_SPOT),
    ]
    try:
        for c in clients:
            await c.connect()
        return {c.worker_id: c.registered.colocation_ack_key for c in clients}
    finally:
        for c in clients:
            await c.close()
        await server.stop()


async def test_each_reserved_worker_gets_its_own_ack_key_and_a_spot_worker_none():
    keys = await _registered(functools.partial(worker_ack_key, KEY, JOB))
    assert keys == {
        "reserved-0": worker_ack_key(KEY, JOB, "reserved-0"),
        "reserved-1": worker_ack_key(KEY, JOB, "reserved-1"),
        "spot-0": "",
    }


async def test_a_manager_without_credentials_gives_no_ack_key():
    assert set((await _registered(None)).values()) == {""}
