"""Whether a reconcile runs the job or holds it at zero (lifecycle.py asks): the job's Kueue Workload synced
(queueing.py), the hold judged (holds.py: spec.suspend, Kueue's admission), the status that says so, and what
follows: a held job still running is suspended (suspension.py: the trainer checkpoints first), a lifted hold cancels
a suspension under way, and a job stopped for a Kueue eviction gives its quota back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from rlboost.spec import JobSpec
from rlboost_operator import children, holds, kueue
from rlboost_operator.queueing import Queueing, kueue_status
from rlboost_operator.shared import JobLinks
from rlboost_operator.status_stream import StatusStream
from rlboost_operator.suspension import Suspender


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


async def forget_job_nats(memo: kopf.Memo, namespace: str, job: str) -> None:
    """A suspended job resumes with a fresh NATS (its pod went to zero, JetStream on an emptyDir): drop the link and
    the status subscriptions, so the reconcile links anew and the status stream is made again on the new server."""
    stream: StatusStream = memo.stream
    await stream.stop(namespace, job)
    links: JobLinks = memo.links
    await links.close(namespace, job)
