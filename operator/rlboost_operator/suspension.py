"""Suspending a running job without losing a step: the trainer is asked over the job's NATS (topic `suspend`, a
request it answers; services/trainer/trainer/suspension.py says why a request and not SIGTERM) to checkpoint at the
end of the step in progress; once it answers that a checkpoint holds every step taken, every child goes to zero and
the RLJob's phase becomes Suspended (holds.py). A Kueue eviction is then handed back to Kueue (queueing.py).

`Suspender` (in kopf's memo) owns one task per job being suspended. It asks until the answer comes, and gives up
waiting (stopping the job anyway, the status saying the checkpoint was not confirmed) when:
- no trainer listens for NO_TRAINER_GRACE_S (NATS answers "no responders", or the job's NATS cannot be reached:
  none runs, or it is between processes; its newest periodic checkpoint is all there is, and resuming from it is
  still bit-exact: the steps after it are recomputed the same way). A trainer that listens but is slow to answer (a
  request timing out) is asked on;
- the operator's `suspend_timeout_s` passed (a trainer stuck in a step).
A job that ends meanwhile (its trainer finished the last step) is not suspended; one whose hold is lifted meanwhile
(spec.suspend back to false) has its task cancelled by the reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import kopf
import nats.errors

from rlboost.wire.events import SUSPEND, SuspendReply, SuspendRequest
from rlboost_operator import status
from rlboost_operator.config import OperatorSettings
from rlboost_operator.holds import PREEMPTED, Hold, suspended_status
from rlboost_operator.job_end import rljob_variants, scale_to_zero
from rlboost_operator.metrics import JOB_SUSPENDING
from rlboost_operator.shared import JobKey, JobLinks, Jobs, KubeLogin
from rlboost_operator.sizing import SpotSizer

log = logging.getLogger(__name__)
ASK_TIMEOUT_S = 5.0  # one request: the trainer answers at once (its state), not when done
ASK_EVERY_S = 1.0  # pause between requests while the step finishes
NO_TRAINER_GRACE_S = 20.0  # no trainer answered for this long: none runs


class Suspender:
    """Suspends jobs (one task each) and, for a Kueue eviction, releases the quota once they stopped."""

    def __init__(
        self, api: KubeLogin, jobs: Jobs, links: JobLinks, sizer: SpotSizer, settings: OperatorSettings
    ) -> None:
        self.api, self.jobs, self.links, self.sizer, self.settings = api, jobs, links, sizer, settings
        self.tasks: dict[JobKey, asyncio.Task[None]] = {}
        self.release: Any = None  # async (namespace, job) -> None: give an evicted Workload's quota back (queueing)

    def ensure(self, namespace: str, job: str, hold: Hold) -> None:
        """Suspend the job unless that is under way."""
        task = self.tasks.get((namespace, job))
        if task is None or task.done():
            self.tasks[(namespace, job)] = asyncio.create_task(self._suspend(namespace, job, hold))

    def cancel(self, namespace: str, job: str) -> None:
        """The hold was lifted (or the RLJob went): stop asking."""
        task = self.tasks.pop((namespace, job), None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for namespace, job in list(self.tasks):
            self.cancel(namespace, job)

    async def _suspend(self, namespace: str, job: str, hold: Hold) -> None:
        JOB_SUSPENDING.labels(namespace, job).set(1)
        try:
            reply = await self.checkpoint(namespace, job, hold)
            async with self.jobs.status_lock(namespace, job):
                await self.stop(namespace, job, hold, reply)
        except asyncio.CancelledError:
            raise
        except Exception:  # the next reconcile starts it again
            log.exception("suspending the job failed", extra={"job": job, "namespace": namespace})
        finally:
            JOB_SUSPENDING.labels(namespace, job).set(0)

    # --- asking the trainer ------------------------------------------------------------------------------

    async def checkpoint(self, namespace: str, job: str, hold: Hold) -> SuspendReply | None:
        """Ask until the trainer says a checkpoint holds every step taken; None when no trainer answered for
        NO_TRAINER_GRACE_S or the timeout passed."""
        request = SUSPEND.encode(SuspendRequest(reason=hold.reason))
        give_up, silent_since = time.monotonic() + self.settings.suspend_timeout_s, time.monotonic()
        while time.monotonic() < give_up:
            reply, listening = await self._ask(namespace, job, request)
            if reply is not None and reply.checkpointed:
                return reply
            if listening:
                silent_since = time.monotonic()
            elif time.monotonic() - silent_since > NO_TRAINER_GRACE_S:
                log.info("no trainer answers: suspending without its checkpoint", extra={"job": job})
                return None
            await asyncio.sleep(ASK_EVERY_S)  # polling a remote process's state, not waiting on our own
        log.warning("the trainer did not checkpoint in time: suspending anyway", extra={"job": job})
        return None

    async def _ask(self, namespace: str, job: str, request: bytes) -> tuple[SuspendReply | None, bool]:
        """One request: (the trainer's answer, whether a trainer listens: it answered, or the request timed out
        although NATS knew a subscriber)."""
        link = self.links.get(namespace, job)
        if link is None:
            return None, False
        try:
            nc = await link.client()
            msg = await nc.request(SUSPEND.subject(namespace, job), request, timeout=ASK_TIMEOUT_S)
        except nats.errors.TimeoutError:
            return None, True  # subscribed but slow (a long step holding its loop, a paused container)
        except (nats.errors.Error, TimeoutError, OSError):
            return None, False  # no responders, or the job's NATS unreachable
        with contextlib.suppress(ValueError):
            return SuspendReply.model_validate_json(msg.data), True
        return None, True

    # --- stopping ----------------------------------------------------------------------------------------

    async def stop(self, namespace: str, job: str, hold: Hold, reply: SuspendReply | None) -> None:
        """Every child to zero and the status Suspended (with the job's status lock held), unless it ended."""
        kube = self.api.client()
        current = await kube.get("RLJob", namespace, job)
        if current is None or status.finished(current.get("status") or {}):
            return
        await self.zero(namespace, job, current)
        previous = current.get("status") or {}
        steps = reply.steps_done if reply is not None else None
        patch = suspended_status(previous, hold, steps, generation=status.generation(current))
        await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
        where = f"after step {steps} (checkpointed)" if steps is not None else "without a confirmed checkpoint"
        target = {"apiVersion": "rlboost.io/v1alpha1", "kind": "RLJob", "metadata": current["metadata"]}
        kopf.info(target, reason="Suspended", message=f"{hold.message}; every child at zero {where}")
        if hold.reason == PREEMPTED and self.release is not None:
            await self.release(namespace, job)

    async def zero(self, namespace: str, job: str, current: dict[str, Any]) -> None:
        """Every workload of the job at zero replicas; no spot rescaling until it resumes."""
        self.sizer.drop(namespace, job)
        await scale_to_zero(self.api.client(), namespace, job, rljob_variants(current))
