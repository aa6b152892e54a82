"""The audit's smaller manager findings (issue 31 item 6), against a real rollout-manager process with the job's
credentials, holding the shared worker token:

- a refused Register with a 600 KB worker_id wrote a 600 KB log line: the id is refused at the wire (its bound,
  a pod name's 253 characters), and every field of every log line is bounded (a real worker's 600 KB drain reason
  is logged as its head and its length);
- a Connect stream that never sends Register stayed open: it is closed after --register-timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.nats_server import free_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from tests.rollout_manager.client import TIMEOUT, WorkerClient
from tests.security.conftest import _serve
from tests.security.test_manager_auth import role, status
from tests.security.test_worker_identity import _refused

LONG = 600_000


async def wait_until_async_call(predicate, timeout: float = TIMEOUT, what: str = "condition") -> None:
    """Await `predicate()` until true, polling with a deadline (it is a call to the manager, not a value)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


LINE_LIMIT = 4096  # every field at most ~1,000 characters


async def test_a_huge_worker_id_is_refused_at_the_wire_and_every_logged_field_is_bounded(creds) -> None:
    port = free_port()
    target, auth = f"127.0.0.1:{port}", ClientAuth.for_role(creds.directory, "worker")
    serve = contextlib.contextmanager(_serve)
    with serve("rollout_manager", creds, port, "--metrics-port", "0") as manager:
        huge = WorkerClient(target, "w" * LONG, auth=auth, heartbeats=False)
        err = await _refused(huge)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == f"register.worker_id: at most 253 characters, got {LONG}"

        real = await WorkerClient(target, "spot-0", auth=auth, identity=creds).connect()
        try:
            real.send(pb.WorkerMessage(drain=pb.DrainNotice(reason="r" * LONG)))  # a real worker's own words

            async def draining() -> bool:
                reply = await status(target, role(creds, "observer"))
                return any(w.worker_id == "spot-0" and w.draining for w in reply.workers)

            await wait_until_async_call(draining, what="the drain taken")
        finally:
            await real.close()
        manager.proc.terminate()
        _, stderr = manager.proc.communicate(timeout=30)
    lines = stderr.splitlines()
    drained = [json.loads(line) for line in lines if '"worker draining"' in line]
    assert drained and drained[0]["reason"].endswith(f"... [{LONG} chars]"), lines[-5:]
    assert max(map(len, lines)) < LINE_LIMIT


async def test_a_stream_that_never_registers_is_closed_after_the_register_timeout(creds) -> None:
    port = free_port()
    target, auth = f"127.0.0.1:{port}", ClientAuth.for_role(creds.directory, "worker")
    serve = contextlib.contextmanager(_serve)
    with serve("rollout_manager", creds, port, "--metrics-port", "0", "--register-timeout", "1"):
        async with auth.aio_channel(target) as channel:
            silent: asyncio.Queue[pb.WorkerMessage] = asyncio.Queue()  # nothing is ever put: no Register

            async def nothing():
                yield await silent.get()

            call = pb_grpc.RolloutManagerStub(channel).Connect(nothing())
            try:
                await asyncio.wait_for(call.read(), TIMEOUT)
                raise AssertionError("the manager answered a stream that never registered")
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "--register-timeout" in err.details()
