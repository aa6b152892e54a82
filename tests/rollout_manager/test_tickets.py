"""Assignment tickets (rollout_manager/tickets.py): a restarted manager adopts a held response only from the
worker the request was assigned to. Pure checks of the MAC, then real gRPC: a manager gives tickets, a second one
with the same key (the restart) refuses held reports with a missing, forged or other worker's ticket, counts
them, and adopts the assigned worker's."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rlboost.wire.rollout_io import HeldResponse
from rollout_manager.server import RolloutManagerServer
from rollout_manager.tickets import TicketBook
from tests.rollout_manager.client import SAFETY_LEASE_MS, WorkerClient, collect_rollout, rollout_request

KEY = b"k" * 32
PROMPT = [100, 200, 300]  # rollout_request's prompt 0


def _held(ticket: str, epoch: int = 1, rid: str = "s0-p0-g0") -> HeldResponse:
    return HeldResponse(rid, 0, PROMPT, [1, 2], [-0.1, -0.2], ticket=ticket, lease_epoch=epoch)


def test_a_ticket_binds_job_request_worker_and_lease_epoch():
    book = TicketBook(KEY, "demo")
    ticket = book.issue("s0-p0-g0", "spot-0", 1)
    assert book.refusal("spot-0", _held(ticket)) is None
    assert book.refusal("spot-1", _held(ticket)) == "ticket_invalid"  # another worker's
    assert book.refusal("spot-0", _held(ticket, epoch=2)) == "ticket_invalid"  # another lease
    assert book.refusal("spot-0", _held(ticket, rid="s0-p0-g1")) == "ticket_invalid"  # another request
    assert book.refusal("spot-0", _held("")) == "ticket_missing"
    assert TicketBook(KEY, "other-job").refusal("spot-0", _held(ticket)) == "ticket_invalid"
    assert TicketBook(b"x" * 32, "demo").refusal("spot-0", _held(ticket)) == "ticket_invalid"  # another key
    with pytest.raises(ValueError, match="manager-ticket.key"):
        TicketBook(b"", "demo")


def _refused(reason: str) -> float:
    return REGISTRY.get_sample_value("rlboost_manager_held_refused_total", {"reason": reason}) or 0.0


async def _serve(tickets: TicketBook) -> tuple[RolloutManagerServer, str]:
    server = RolloutManagerServer(
        RolloutSpec(heartbeat_interval_ms=50, lease_timeout_ms=SAFETY_LEASE_MS),
        balance_interval_s=3600.0,
        tickets=tickets,
    )
    return server, f"127.0.0.1:{await server.start('127.0.0.1', 0)}"


async def _report(target: str, worker_id: str, held: pb.HeldResponse) -> WorkerClient:
    client = WorkerClient(target, worker_id, capacity=1)
    client.register.held.append(held)
    return await client.connect()


async def test_a_restarted_manager_adopts_a_held_response_only_with_its_workers_ticket():
    first, target = await _serve(TicketBook(KEY, "demo"))
    worker = await WorkerClient(target, "spot-0", capacity=1).connect()
    step = asyncio.create_task(collect_rollout(target, rollout_request(max_new_tokens=4)))
    (a,) = (await worker.expect("assign")).assign.assignments
    assert len(a.ticket) == 64, "every assignment carries a ticket"
    await worker.drop()
    step.cancel()
    await first.stop(grace=0)  # the manager restarts: a new one with the job's same key

    second, target = await _serve(TicketBook(KEY, "demo"))
    clients = []
    try:
        own = pb.HeldResponse(
            request_id=a.request_id,
            weight_version=0,
            prompt_ids=PROMPT,
            token_ids=[7, 8, 9, 10],
            logprobs=[-0.5] * 4,
            finished=True,
            finish_reason="length",
            ticket=a.ticket,
            lease_epoch=a.lease_epoch,
        )
        clients.append(await _report(target, "spot-0", own))
        before = {r: _refused(r) for r in ("ticket_invalid", "ticket_missing")}
        forged = [("spot-1", a.ticket), ("spot-2", "0" * 64), ("spot-3", "")]  # another worker's, forged, none
        for wid, ticket in forged:
            attack = pb.HeldResponse()
            attack.CopyFrom(own)
            attack.token_ids[:], attack.ticket = [1, 1, 1, 1], ticket
            clients.append(await _report(target, wid, attack))
        assert _refused("ticket_invalid") - before["ticket_invalid"] == 2
        assert _refused("ticket_missing") - before["ticket_missing"] == 1
        (traj,) = await asyncio.wait_for(collect_rollout(target, rollout_request(max_new_tokens=4)), 10)
        assert list(traj.response_ids) == [7, 8, 9, 10], "the assigned worker's tokens, not an attacker's"
        assert second.state.held.adopted == 1
    finally:
        for c in clients:
            await c.drop()
        await second.stop(grace=0)
