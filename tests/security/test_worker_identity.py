"""A holder of the shared worker token cannot join under an id or pool it cannot prove (issue 14 item 1).

Against a real rollout-manager process started with the job's credentials, as `rlboost local` starts it: the
worker token alone used to let a client register as a fresh reserved worker (and get that id's colocation-ack
key, and reserved work). Each probe is refused with a status naming the field, counted in
`rlboost_manager_identity_refused_total`, and the proven worker keeps its step.
"""

from __future__ import annotations

import contextlib

import grpc
import httpx

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.nats_server import free_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from tests.rollout_manager.client import WorkerClient, identity_proof
from tests.security.conftest import _serve
from tests.security.test_manager_auth import _victim_still_serves_a_step, live_ids, refused_register


def _refused_count(metrics_port: int, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    line = f'rlboost_manager_identity_refused_total{{reason="{reason}"}}'
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(line))


async def test_the_worker_token_alone_joins_under_no_id_and_a_proof_only_under_its_own(creds):
    port, metrics_port = free_port(), free_port()
    target, auth = f"127.0.0.1:{port}", ClientAuth.for_role(creds.directory, "worker")
    serve = contextlib.contextmanager(_serve)
    with serve("rollout_manager", creds, port, "--metrics-port", str(metrics_port)) as manager:
        real = await WorkerClient(target, "spot-0", auth=auth, identity=creds).connect()
        try:
            # The audit's hole: a fresh reserved id with the worker token and no proof.
            fresh = await refused_register(target, "reserved-9", auth)
            assert fresh.code() == grpc.StatusCode.UNAUTHENTICATED and "identity_proof" in fresh.details()

            # A spot worker's real proof, used to claim the reserved pool, or another id.
            promoted = WorkerClient(target, "spot-0", pool=pb.POOL_RESERVED, auth=auth, heartbeats=False)
            promoted.register.identity_proof = identity_proof(creds, "spot-0", pb.POOL_SPOT)
            other_id = WorkerClient(target, "spot-7", auth=auth, heartbeats=False)
            other_id.register.identity_proof = identity_proof(creds, "spot-0", pb.POOL_SPOT)
            for claim in (promoted, other_id):
                err = await _refused(claim)
                assert err.code() == grpc.StatusCode.UNAUTHENTICATED and "not the runner's token" in err.details()

            # A proof minted with another job's key.
            forged = WorkerClient(target, "reserved-9", pool=pb.POOL_RESERVED, auth=auth, heartbeats=False)
            forged.register.identity_proof = "rlboost-local-v1." + "0" * 64
            assert (await _refused(forged)).code() == grpc.StatusCode.UNAUTHENTICATED

            assert _refused_count(metrics_port, "unauthenticated") >= 4
            assert await live_ids(manager) == ["spot-0"]
            await _victim_still_serves_a_step(manager, real)
        finally:
            await real.close()


async def _refused(claim: WorkerClient) -> grpc.aio.AioRpcError:
    try:
        try:
            await claim.connect()
        except grpc.aio.AioRpcError as err:
            return err
        raise AssertionError(f"{claim.worker_id} registered without a proof of its id and pool")
    finally:
        await claim.channel.close()
