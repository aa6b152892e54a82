"""The audit's held-token probe against real rollout-manager processes started with the job's credentials.

After a manager restart, workers re-report the responses they held (Register.held) and the new manager adopts
their tokens. Every worker shares the worker token, so a worker used to be able to report tokens for a request of
another worker (and replace that worker's response). Now each assignment carries a ticket (an HMAC with the job's
`manager-ticket.key`, which outlives the manager's process) bound to the worker id; the restarted manager refuses
a held response whose ticket is missing or not that worker's, counts it, and keeps the assigned worker's tokens.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

from rlboost.auth.credentials import JobCredentials
from rlboost.auth.grpc_auth import ClientAuth
from rlboost.nats_server import free_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from tests.rollout_manager.client import WorkerClient, rollout_request
from tests.security.conftest import _serve

PROMPT = [100, 200, 300]  # rollout_request's prompt 0
VICTIM_TOKENS, FORGED_TOKENS = [7, 8, 9, 10], [1, 1, 1, 1]


async def _rollout(target: str, creds: JobCredentials) -> list[pb.Trajectory]:
    request = rollout_request(group=2, max_new_tokens=4)
    async with ClientAuth.for_role(creds.directory, "trainer").aio_channel(target) as ch:
        return [t async for b in pb_grpc.RolloutManagerStub(ch).Rollout(request) for t in b.trajectories]


def _held(a: pb.Assignment, tokens: list[int], ticket: str) -> pb.HeldResponse:
    return pb.HeldResponse(
        request_id=a.request_id,
        weight_version=0,
        prompt_ids=PROMPT,
        token_ids=tokens,
        logprobs=[-0.5] * len(tokens),
        finished=True,
        finish_reason="length",
        ticket=ticket,
        lease_epoch=a.lease_epoch,
    )


def _refused(metrics: str, reason: str) -> float:
    line = f'rlboost_manager_held_refused_total{{reason="{reason}"}}'
    return sum(float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith(line))


async def test_a_restarted_manager_refuses_held_tokens_reported_without_the_assigned_workers_ticket(creds):
    port, worker_auth = free_port(), ClientAuth.for_role(creds.directory, "worker")
    target = f"127.0.0.1:{port}"
    with contextlib.contextmanager(_serve)("rollout_manager", creds, port, "--metrics-port", "0"):
        victim = await WorkerClient(target, "spot-0", capacity=1, auth=worker_auth, identity=creds).connect()
        attacker = await WorkerClient(target, "spot-1", capacity=1, auth=worker_auth, identity=creds).connect()
        step = asyncio.create_task(_rollout(target, creds))
        (mine,) = (await victim.expect("assign")).assign.assignments
        (theirs,) = (await attacker.expect("assign")).assign.assignments
        for c in (victim, attacker):
            await c.drop()
    step.cancel()  # the manager is gone (SIGTERM); a new one starts on the same port with the same credentials

    metrics_port = free_port()
    with contextlib.contextmanager(_serve)("rollout_manager", creds, port, "--metrics-port", str(metrics_port)):
        victim = WorkerClient(target, "spot-0", capacity=1, auth=worker_auth, identity=creds)
        victim.register.held.append(_held(mine, VICTIM_TOKENS, mine.ticket))
        await victim.connect()
        attacker = WorkerClient(target, "spot-1", capacity=1, auth=worker_auth, identity=creds)
        attacker.register.held.extend(
            [
                _held(theirs, [3, 3, 3, 3], theirs.ticket),  # its own response: adopted
                _held(mine, FORGED_TOKENS, theirs.ticket),  # the victim's request under its own ticket
                _held(mine, FORGED_TOKENS, ""),  # and with none
            ]
        )
        await attacker.connect()
        trajectories = await asyncio.wait_for(_rollout(target, creds), 15)  # the trainer re-attaches
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
        for c in (victim, attacker):
            await c.drop()

    by_id = {t.request_id: list(t.response_ids) for t in trajectories}
    assert by_id == {mine.request_id: VICTIM_TOKENS, theirs.request_id: [3, 3, 3, 3]}, "an attacker's tokens got in"
    assert _refused(metrics, "ticket_invalid") == 1 and _refused(metrics, "ticket_missing") == 1
