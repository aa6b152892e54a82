"""The audit's colocation-ack probe: a real rollout-manager process and a real nats-server, both with the job's
credentials, and the trainer's colocation handshake (trainer.colocation, in this process, so its metrics can be
read) with the job's colocation.key.

Every worker connects to NATS as the one user `worker`, and a colocation ack names its worker: a reserved worker
used to be able to ack a release in another reserved worker's name, so the trainer stopped waiting (and started
training) while that worker still held accelerator memory. Now each ack carries a MAC with the acking worker's
own key, which only the manager hands out, to the reserved worker id bound to the stream's session: an attacker
holding the worker token and password, registered as a reserved worker itself, acks as the victim with its own key
(and with none, and a spot worker acks under its own id); every one is refused and counted, the wait does not
end, and the victim's real ack ends it."""

from __future__ import annotations

import contextlib

import nats
from prometheus_client import REGISTRY

from rlboost.auth.colocation_acks import AckVerifier, sign
from rlboost.auth.credentials import JobCredentials
from rlboost.auth.grpc_auth import ClientAuth
from rlboost.auth.nats import connect_options
from rlboost.auth.nats_config import passwords_of, render_nats_config
from rlboost.nats_server import NatsServer, free_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.events import COLOCATION, COLOCATION_ACKS, ColocationAck, ColocationCommand
from tests.rollout_manager.client import WorkerClient
from tests.security.conftest import _serve
from trainer.colocation import Colocation

NS, JOB = "default", "acks"


def _refused(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_trainer_colocation_acks_refused_total", {"reason": reason}) or 0.0


async def _acking(nc, claims: list[tuple[str, str]]) -> None:
    """A NATS client (user `worker`) that acks every colocation command once per (claimed worker id, key)."""

    async def on_command(msg) -> None:
        cmd = ColocationCommand.model_validate_json(msg.data)
        for worker_id, key in claims:
            ack = sign(ColocationAck(step=cmd.step, action=cmd.action, worker_id=worker_id, released=True), key)
            await nc.publish(COLOCATION_ACKS.subject(NS, JOB), ack.model_dump_json().encode())

    await nc.subscribe(COLOCATION.subject(NS, JOB), cb=on_command)
    await nc.flush()


def _job_nats(creds: JobCredentials, store) -> NatsServer:
    port = free_port()
    config = render_nats_config(passwords_of(creds), NS, JOB, listen=f"127.0.0.1:{port}", store_dir=str(store))
    return NatsServer(store, port=port, config=config)


async def test_an_ack_in_another_reserved_workers_name_is_refused_and_the_real_one_accepted(creds, tmp_path):
    port, worker_auth = free_port(), ClientAuth.for_role(creds.directory, "worker")
    target = f"127.0.0.1:{port}"
    serve = contextlib.contextmanager(_serve)
    with serve("rollout_manager", creds, port, "--job", JOB), _job_nats(creds, tmp_path / "nats") as server:
        workers = {
            wid: await WorkerClient(
                target, wid, pool=pool, capacity=1, auth=worker_auth, identity=creds, job=JOB
            ).connect()
            for wid, pool in (
                ("reserved-0", pb.POOL_RESERVED),
                ("reserved-1", pb.POOL_RESERVED),
                ("spot-0", pb.POOL_SPOT),
            )
        }
        key = {wid: w.registered.colocation_ack_key for wid, w in workers.items()}
        assert key["reserved-0"] and key["reserved-1"] and key["reserved-0"] != key["reserved-1"]
        assert key["spot-0"] == "", "a spot worker was given a colocation-ack key"

        trainer_nc = await nats.connect(server.url, **connect_options(creds.directory, "trainer"))
        attacker_nc = await nats.connect(server.url, **connect_options(creds.directory, "worker"))
        victim_nc = await nats.connect(server.url, **connect_options(creds.directory, "worker"))
        try:
            colo = Colocation(
                trainer_nc, NS, JOB, workers=1, timeout_s=1.5, verifier=AckVerifier(creds.colocation_key(), JOB)
            )
            await colo.start()
            await _acking(attacker_nc, [("reserved-0", key["reserved-1"]), ("reserved-0", ""), ("spot-0", "")])
            invalid, missing = _refused("mac_invalid"), _refused("mac_missing")
            forged = await colo.release(0, version=0)
            assert forged.acked == 0, "a forged ack ended the trainer's wait"
            assert _refused("mac_invalid") > invalid and _refused("mac_missing") > missing

            colo.timeout_s = 15
            await _acking(victim_nc, [("reserved-0", key["reserved-0"])])  # the victim itself
            real = await colo.release(1, version=1)
            assert (real.acked, real.failed) == (1, [])
        finally:
            for nc in (trainer_nc, attacker_nc, victim_nc):
                await nc.close()
            for w in workers.values():
                await w.close()
