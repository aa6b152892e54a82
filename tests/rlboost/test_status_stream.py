"""rlboost.local.status_stream against a real nats-server with JetStream: what a resumed run learns of the
earlier run of its run dir (the last step report stored), so a resumed trainer's re-sent report of its
checkpoint's step is not shown twice, while one the earlier run never got is."""

from __future__ import annotations

import nats

from rlboost.local.status_stream import ensure_status_stream
from rlboost.wire.events import DONE, STEPS, StepReport

NS, JOB = "default", "j"


def _report(step: int) -> bytes:
    return (
        StepReport(
            step=step,
            weight_version=step + 1,
            weights_checksum="ab" * 32,
            reward_mean=0.5,
            tokens=96,
            rollout_seconds=1.0,
            train_seconds=0.2,
            sync_seconds=0.1,
        )
        .model_dump_json()
        .encode()
    )


async def test_a_resumed_run_knows_the_last_step_report_the_stream_holds(nats_server) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        first = await ensure_status_stream(nc, NS, JOB)
        assert first.last_step_before is None  # a new run dir: nothing before
        js = nc.jetstream()
        for step in (0, 1):
            await js.publish(STEPS.subject(NS, JOB), _report(step))
        await js.publish(DONE.subject(NS, JOB), b"{}")  # the last message need not be a step report
        resumed = await ensure_status_stream(nc, NS, JOB)
        assert resumed.last_step_before == 1 and resumed.next_seq == 4
    finally:
        await nc.close()
