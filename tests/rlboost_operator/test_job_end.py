"""The end of a job (job_end.py): the status says how it ended before any workload is scaled, so an operator killed
in between leaves a job whose next reconcile keeps it at zero (an ended status is what lifecycle.py keeps there).

Pure: the Kubernetes API is a recording stand-in whose first workload patch kills the "operator" (raises), the
moment the cluster lane's chaos caught (the leader SIGKILLed after scaling, before the status: the job stayed at
zero, Running, with nothing left to publish `done` again)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rlboost.wire.events import JobDone
from rlboost_operator import status
from rlboost_operator.job_end import end_job


class OperatorKilledError(Exception):
    """The operator process died here."""


class RecordingKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    async def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], sub: str | None = None) -> None:
        self.patches.append((kind, name, body))
        if kind != "RLJob":
            raise OperatorKilledError


class Sizer:
    def drop(self, namespace: str, job: str) -> None:
        pass


def test_the_end_is_written_before_any_workload_is_scaled() -> None:
    kube = RecordingKube()
    current = {"metadata": {"name": "job1", "namespace": "ns1", "generation": 3}, "status": {"phase": "Running"}}
    outcome = status.done_status(JobDone(ok=True, steps=40), current["status"])
    with pytest.raises(OperatorKilledError):
        asyncio.run(end_job(kube, Sizer(), current, outcome, "JobFinished", ("JobSucceeded", "40 steps"), ok=True))  # type: ignore[arg-type]
    kind, name, body = kube.patches[0]
    assert (kind, name) == ("RLJob", "job1") and body["status"]["phase"] == "Succeeded"
    assert status.finished({**current["status"], **body["status"]}), "the next reconcile would not keep it at zero"
