"""The status stream keeps up with a job whose steps come faster than a status write: reports that arrive while one
is being written are superseded by the newest, which is written next (a validation summary is kept).

Pure: the status write itself (API calls against the RLJob) is a recording stand-in that blocks until released;
test_operator.py drives the real write against kmock and NATS."""

from __future__ import annotations

import asyncio

from rlboost.wire.events import STEPS, StepReport, ValidationReport
from rlboost_operator.shared import Jobs
from rlboost_operator.status_stream import StatusStream


class RecordingStream(StatusStream):
    def __init__(self) -> None:
        super().__init__(api=None, jobs=Jobs(), links=None, sizer=None)  # type: ignore[arg-type]
        self.written: list[StepReport] = []
        self.release = asyncio.Event()

    async def _write_step(self, namespace: str, job: str, spec, report: StepReport) -> None:  # type: ignore[override]
        self.written.append(report)
        await self.release.wait()  # a slow API server: the first write is still going when the rest arrive


def _report(step: int, validation: ValidationReport | None = None) -> bytes:
    report = StepReport(
        step=step, reward_mean=0.5, tokens=10, rollout_seconds=0.1, train_seconds=0.1, sync_seconds=0.0,
        weight_version=step + 1, weights_checksum="abc", validation=validation,
    )  # fmt: skip
    return STEPS.encode(report)


async def test_reports_arriving_during_a_write_are_superseded_by_the_newest() -> None:
    stream = RecordingStream()
    validation = ValidationReport(
        step=5, weight_version=6, reward_mean=0.5, pass_at_1=0.25, pass_at_k=0.75, k=4, prompts=16,
        response_tokens_mean=5.5,
    )  # fmt: skip
    await stream.on_step("ns", "job", None, _report(0))  # type: ignore[arg-type]
    await asyncio.wait_for(_until(lambda: len(stream.written) == 1), 10)  # step 0's write has begun
    for step in range(1, 10):
        await stream.on_step("ns", "job", None, _report(step, validation if step == 5 else None))  # type: ignore[arg-type]
    stream.release.set()
    await asyncio.wait_for(stream.writers[("ns", "job")], 10)
    assert [r.step for r in stream.written] == [0, 9]  # not ten writes: the newest one after the first
    assert stream.written[-1].validation == validation  # step 5's evaluation still reaches the status


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0)  # yield to the writer task; no wall-clock wait
