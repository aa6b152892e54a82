"""The audit's gRPC probes against a real rollout-manager process started with the job's credentials: each is
refused with a status that names the token needed, and the real worker and step lose nothing.

Audit: an unauthenticated client connected with a real worker's id and ended that worker's stream; a forged
worker put bad trajectories in. Workers share the worker role's token, so a holder of it must not take over a
live worker's id either (the manager binds an id to the session it issued: rollout_manager/identity.py), nor
register under an id it cannot prove (tests/security/test_worker_identity.py).
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from rlboost.auth.credentials import JobCredentials
from rlboost.auth.grpc_auth import ClientAuth
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from tests.rollout_manager.client import TIMEOUT, WorkerClient, rollout_request
from tests.security.conftest import Service

VICTIM = "spot-0"
STREAM_END_WAIT_S = 60.0


def role(creds: JobCredentials, name: str) -> ClientAuth:
    return ClientAuth.for_role(creds.directory, name)


async def status(target: str, auth: ClientAuth) -> pb.StatusReply:
    async with auth.aio_channel(target) as ch:
        return await pb_grpc.RolloutManagerStub(ch).GetStatus(pb.StatusRequest(), timeout=TIMEOUT)


async def refused_register(
    target: str, worker_id: str, auth: ClientAuth, session_token: str = "", identity: JobCredentials | None = None
) -> grpc.aio.AioRpcError:
    """Open a Connect stream claiming `worker_id` and return the error that ends it (fails if it registers).

    A refusal from the token check ends the call before the manager reads the Register: when that status reaches
    the client before the client's send of the Register completes (a slow, loaded machine), grpc fails the send
    and reports its own INTERNAL status in place of the manager's. The probe is then made again (as a worker's
    reconnect would): the manager refused it either way, and only its own status says why."""
    for _ in range(5):
        claim = WorkerClient(target, worker_id, auth=auth, heartbeats=False, identity=identity)
        claim.register.session_token = session_token
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await claim.connect()
        finally:
            await claim.channel.close()
        if not _lost_send_race(err.value):
            break
    return err.value


def _lost_send_race(err: grpc.aio.AioRpcError) -> bool:
    return err.code() == grpc.StatusCode.INTERNAL and "execute_batch" in (err.debug_error_string() or "")


async def live_ids(manager: Service) -> list[str]:
    return [w.worker_id for w in (await status(manager.target, role(manager.creds, "observer"))).workers]


async def test_a_client_without_the_worker_token_cannot_end_or_replace_a_live_workers_stream(manager: Service):
    creds = manager.creds
    victim = await WorkerClient(manager.target, VICTIM, auth=role(creds, "worker"), identity=creds).connect()
    session = victim.registered.session_token
    assert session, "the manager issues each worker a session token"
    try:
        anonymous = await refused_register(manager.target, VICTIM, ClientAuth())
        assert anonymous.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "worker token" in anonymous.details() and "token-worker" in anonymous.details()

        observer = await refused_register(manager.target, VICTIM, role(creds, "observer"))
        assert observer.code() == grpc.StatusCode.PERMISSION_DENIED and "observer" in observer.details()

        # Another holder of the shared worker token claims the live id: it cannot prove it is that worker.
        forged = await refused_register(manager.target, VICTIM, role(creds, "worker"))
        assert forged.code() == grpc.StatusCode.UNAUTHENTICATED and "identity_proof" in forged.details()

        # Even with the worker's own proof (a second process of its pod), a live id needs its session.
        for guess in ("", "not-the-session"):
            forged = await refused_register(manager.target, VICTIM, role(creds, "worker"), guess, creds)
            assert forged.code() == grpc.StatusCode.ALREADY_EXISTS
            assert VICTIM in forged.details() and "session_token" in forged.details()

        assert await live_ids(manager) == [VICTIM]
        await _victim_still_serves_a_step(manager, victim)
    finally:
        await victim.close()


async def _victim_still_serves_a_step(manager: Service, victim: WorkerClient) -> None:
    """The trainer's step is placed on the victim and comes back whole: nothing was lost to the probes."""
    async with role(manager.creds, "trainer").aio_channel(manager.target) as ch:
        call = pb_grpc.RolloutManagerStub(ch).Rollout(rollout_request(max_new_tokens=2))
        assign = (await victim.expect("assign")).assign.assignments[0]
        victim.chunk(assign.request_id, assign.lease_epoch, 0, [5, 6], finished=True, reason="length")
        batch = await asyncio.wait_for(call.read(), TIMEOUT)
    assert [(t.response_ids, t.workers) for t in batch.trajectories] == [([5, 6], [VICTIM])]


async def test_a_worker_reconnecting_with_its_session_token_replaces_its_own_stream(manager: Service):
    """A network blip: the worker opens a new stream before the manager saw the old one break."""
    auth = role(manager.creds, "worker")
    first = await WorkerClient(manager.target, VICTIM, auth=auth, identity=manager.creds).connect()
    again = WorkerClient(manager.target, VICTIM, auth=auth, identity=manager.creds)
    again.register.session_token = first.registered.session_token
    await again.connect()
    try:
        assert again.registered.session_token == first.registered.session_token
        assert await live_ids(manager) == [VICTIM]
        with pytest.raises(AssertionError, match="stream ended"):  # the old stream was ended by the manager
            await first.expect("assign")
    finally:
        first.stop_heartbeats()
        await first.channel.close()
        await again.close()


async def test_a_restarted_worker_reclaims_its_id_once_its_old_stream_is_gone(manager: Service):
    auth = role(manager.creds, "worker")
    old = await WorkerClient(manager.target, VICTIM, auth=auth, identity=manager.creds).connect()
    await old.drop()  # the process died: its session token died with it
    # A safety net, not the behaviour: the manager sees the stream's end at once when it gets CPU; beside two
    # suites it took more than TIMEOUT (5 s) once, and the reclaim then ran too early and was (rightly) refused.
    deadline = asyncio.get_running_loop().time() + STREAM_END_WAIT_S
    while (live := await live_ids(manager)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)  # polling the manager's status until the stream's end is seen
    assert not live, f"the manager still lists {live} {STREAM_END_WAIT_S} s after the worker's stream was cancelled"
    new = await WorkerClient(manager.target, VICTIM, auth=auth, identity=manager.creds).connect()
    try:
        assert new.registered.session_token != old.registered.session_token
    finally:
        await new.close()


@pytest.mark.parametrize(
    ("who", "code"),
    [
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("worker", grpc.StatusCode.PERMISSION_DENIED),
        ("observer", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
async def test_rollout_needs_the_trainer_token(manager: Service, who: str | None, code: grpc.StatusCode):
    auth = role(manager.creds, who) if who else ClientAuth()
    async with auth.aio_channel(manager.target) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in pb_grpc.RolloutManagerStub(ch).Rollout(rollout_request(), timeout=TIMEOUT):
                pass
    assert err.value.code() == code and "trainer token" in err.value.details()
    reply = await status(manager.target, role(manager.creds, "trainer"))
    assert reply.pending == 0, "a refused Rollout queued no work"


async def test_status_reads_need_an_observer_or_trainer_token(manager: Service):
    for auth, code in [
        (ClientAuth(), grpc.StatusCode.UNAUTHENTICATED),
        (ClientAuth(token="guessed"), grpc.StatusCode.UNAUTHENTICATED),
        (role(manager.creds, "worker"), grpc.StatusCode.PERMISSION_DENIED),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await status(manager.target, auth)
        assert err.value.code() == code and "observer" in err.value.details()
    assert (await status(manager.target, role(manager.creds, "observer"))).workers == []


async def test_with_tls_a_plaintext_client_gets_nothing_and_a_client_trusting_the_job_ca_works(tls_creds):
    from rlboost.nats_server import free_port
    from tests.security.conftest import _serve

    services = _serve("rollout_manager", tls_creds, free_port(), "--metrics-port", "0")
    manager = next(services)
    try:
        plaintext = ClientAuth(token=tls_creds.token("observer"))  # the right token, but no TLS
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await status(manager.target, plaintext)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (await status(manager.target, role(tls_creds, "observer"))).workers == []
    finally:
        services.close()
