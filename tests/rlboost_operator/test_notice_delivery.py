"""Preemption notices arrive even when the rollout-manager is away: the operator's NatsLink sends each as a request
and re-sends it until the manager's PreemptionSubscriber acknowledges it (issue 14: messages that must arrive are
durable or re-sent until acknowledged). A real nats-server with the job's users and permissions (the manager may
only answer, through allow_responses), the operator's real publisher and the manager's real subscriber.
"""

from __future__ import annotations

import asyncio

from rlboost.auth.nats import connect_options
from rlboost.wire.events import PreemptionNotice
from rlboost_operator.notices import NatsLink
from rollout_manager.preemption import PreemptionSubscriber
from tests.rlboost.conftest import JOB, NS, job_nats  # noqa: F401  (the fixture: a job's NATS with its users)

NOTICE = PreemptionNotice(node="spot-7", workers=["w-1"], reason="gke-termination", deadline_s=30.0)


def _manager(server, creds, drained: list[tuple[str, list[str]]]) -> PreemptionSubscriber:
    def drain(node: str, workers: list[str], _reason: str) -> list[str]:
        drained.append((node, workers))
        return workers

    return PreemptionSubscriber(server.url, NS, JOB, drain, nats_options=connect_options(creds.directory, "manager"))


async def _wait_for(condition, timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.05)  # polling a condition with a deadline
    assert condition(), what


def test_a_notice_sent_while_the_manager_is_away_is_re_sent_until_it_is_acknowledged(job_nats) -> None:  # noqa: F811
    server, creds = job_nats

    async def main() -> None:
        link = NatsLink(server.url, options=connect_options(creds.directory, "operator"))
        drained: list[tuple[str, list[str]]] = []
        try:
            assert await link.publish_notice(NS, JOB, NOTICE) is False  # nobody answered: re-sent in the background
            manager = _manager(server, creds, drained)
            await manager.start()  # the manager comes back (a restart): the next re-send reaches it
            try:
                await _wait_for(lambda: drained and not link._resending, 15, "the notice acknowledged")
            finally:
                await manager.stop()
        finally:
            await link.close()
        assert drained[0] == ("spot-7", ["w-1"])

    asyncio.run(main())


def test_a_notice_the_manager_receives_is_acknowledged_at_once_and_drains_once(job_nats) -> None:  # noqa: F811
    server, creds = job_nats

    async def main() -> None:
        drained: list[tuple[str, list[str]]] = []
        manager = _manager(server, creds, drained)
        await manager.start()
        link = NatsLink(server.url, options=connect_options(creds.directory, "operator"))
        try:
            assert await link.publish_notice(NS, JOB, NOTICE) is True
            assert not link._resending and drained == [("spot-7", ["w-1"])]
        finally:
            await link.close()
            await manager.stop()

    asyncio.run(main())
