"""Whether a reconcile runs the job or holds it at zero (lifecycle.py asks): the job's Kueue Workload synced
(queueing.py), the hold judged (holds.py: spec.suspend, Kueue's admission), the status that says so, and what
follows: a held job still running is suspended (suspension.py: the trainer checkpoints first), a lifted hold cancels
a suspension under way, and a job stopped for a Kueue eviction gives its quota back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from rlboost.spec import JobSpec
from rlboost_operator import children, holds, kueue, status
from rlboost_operator.checks import SpecProblemError
from rlboost_operator.queueing import Queueing, kueue_status
from rlboost_operator.shared import JobLinks
from rlboost_operator.status_stream import StatusStream
from rlboost_operator.suspension import Suspender

FORGET_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Gate:
    """One reconcile's judgement: the job's Workload as Kueue left it (None: not queued), its LocalQueue and the
    hold (None: it may run)."""

    state: kueue.Admission | None
    queue: str
    hold: holds.Hold | None

    def status(
        self, previous: Mapping[str, Any], patch: Mapping[str, Any], stopped: bool, generation: int | None
    ) -> dict[str, Any]:
        """The .status fields this judgement sets, on top of the reconcile's `patch`."""
        merged = {**previous, **patch}
        out: dict[str, Any] = {"kueue": kueue_status(self.state, self.queue)}
        if self.hold is not None and stopped:
            out.update(holds.suspended_status(merged, self.hold, None, generation=generation))
        elif self.hold is not None and (previous.get("suspension") or {}).get("state") != "Suspending":
            out.update(holds.suspending_status(merged, self.hold, generation=generation))
        elif self.hold is None and holds.suspended(previous):
            out.update(holds.resumed_status(merged, generation=generation))
        elif self.hold is None and (previous.get("suspension") or {}).get("state") == "Suspending":
            out.update(holds.cancelled_status(merged, generation=generation))
        return out

    async def follow_up(self, memo: kopf.Memo, namespace: str, job: str, stopped: bool) -> None:
        suspender: Suspender = memo.suspender
        if self.hold is None:
            suspender.cancel(namespace, job)
        elif not stopped:
            suspender.ensure(namespace, job, self.hold)
        elif self.hold.reason == holds.PREEMPTED:
            queueing: Queueing = memo.queueing
            await queueing.release(namespace, job)


async def judge_hold(memo: kopf.Memo, body: kopf.Body, spec: JobSpec, previous: Mapping[str, Any], ended: bool) -> Gate:
    """The job's Workload synced (asking for its children as they run) and its hold judged; an ended job has none."""
    if ended:
        return Gate(None, "", None)
    queueing: Queueing = memo.queueing
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    queue = queueing.queue(body.metadata.labels)
    state = None
    if queue:
        labels = children.job_labels(body.metadata.labels)
        running = children.build_children(job, namespace, spec, memo.settings, 0, job_labels=labels)
        state = await queueing.sync(body, running, previous)
    return Gate(state, queue, holds.hold_for(spec, queue, state))


async def suspend_early(memo: kopf.Memo, body: kopf.Body, spec: JobSpec) -> None:
    """Ask a held job's trainer to checkpoint now, before the reconcile waits for the job's status lock: step
    reports waiting for that lock (an operator that fell behind on a loaded cluster) must not hold back the request,
    while the trainer keeps taking steps. The reconcile judges again under the lock; the suspension's own end (scaling
    to zero) takes the lock."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    previous = ((await memo.api.client().get("RLJob", namespace, job)) or {}).get("status") or {}
    if status.finished(previous) or holds.never_ran(previous):
        return
    try:
        gate = await judge_hold(memo, body, spec, previous, ended=False)
    except SpecProblemError:
        return  # the reconcile under the lock reports it
    if gate.hold is not None:
        suspender: Suspender = memo.suspender
        suspender.ensure(namespace, job, gate.hold)


async def forget_job_nats(memo: kopf.Memo, namespace: str, job: str) -> None:
    """A suspended job resumes with a fresh NATS (its pod went to zero, JetStream on an emptyDir): drop the link and
    the status subscriptions, so the reconcile links anew and the status stream is made again on the new server."""
    stream: StatusStream = memo.stream
    await stream.stop(namespace, job)
    links: JobLinks = memo.links
    with contextlib.suppress(TimeoutError):  # draining a link to a server that went away can take its 30 s timeout
        await asyncio.wait_for(links.close(namespace, job), FORGET_TIMEOUT_S)
