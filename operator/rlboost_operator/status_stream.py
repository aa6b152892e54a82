"""The status stream: each running job's `steps` and `done` subjects (on its own NATS) followed into its RLJob's
.status: a step report becomes the step, reward, throughput, ready workers and cost (status.step_status), and moves
busy sizing's target; `done` ends the job (job_end.py). `StatusStream` (in kopf's memo) owns the subscriptions, one
pair per job until the RLJob goes, and the tasks that retry subscribing until the job's NATS is up."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from functools import partial
from typing import Any

import kopf

from rlboost.spec import JobSpec
from rlboost.wire.events import DONE, STEPS, StepReport
from rlboost_operator import children, spot_busy, status
from rlboost_operator.job_end import end_job, rljob_variants, scale_to_zero
from rlboost_operator.metrics import ERRORS, READY_WORKERS
from rlboost_operator.shared import JobKey, JobLinks, Jobs, KubeLogin
from rlboost_operator.sizing import SpotSizer

log = logging.getLogger(__name__)


class StatusStream:
    """Follows the running jobs' status subjects into their RLJobs. Owns: each job's subscriptions (kept until the
    RLJob goes) and the follower tasks still trying to subscribe."""

    def __init__(self, api: KubeLogin, jobs: Jobs, links: JobLinks, sizer: SpotSizer) -> None:
        self.api, self.jobs, self.links, self.sizer = api, jobs, links, sizer
        self.subscriptions: dict[JobKey, list[Any]] = {}  # (ns, job) -> its NATS subscriptions
        self.followers: dict[JobKey, asyncio.Task[None]] = {}  # (ns, job) -> still subscribing
        self.newest: dict[JobKey, StepReport] = {}  # (ns, job) -> the newest step report not yet written
        self.writers: dict[JobKey, asyncio.Task[None]] = {}  # (ns, job) -> writing its newest reports

    # --- following ---------------------------------------------------------------------------------------

    def follow_soon(self, namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
        """Follow the job's status subjects from a task that retries until subscribed: the job's own NATS starts
        with the job (a new pod, maybe an image pull), and the reconcile must not wait for it."""
        key = (namespace, job)
        running = self.followers.get(key)
        if key in self.subscriptions or (running is not None and not running.done()):
            return
        self.followers[key] = asyncio.create_task(self._follow_until_subscribed(namespace, job, spec, since))

    async def _follow_until_subscribed(self, namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
        pause = 1.0
        while (namespace, job) not in self.subscriptions:
            try:
                await self.subscribe(namespace, job, spec, since)
            except kopf.TemporaryError as err:
                extra = {"job": job, "namespace": namespace, "error": str(err), "in_s": pause}
                log.warning("cannot follow the job's status yet; trying again", extra=extra)
                await asyncio.sleep(pause)
                pause = min(2 * pause, 10.0)

    async def subscribe(self, namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
        """Subscribe to the job's `steps` and `done` subjects, once per job (kept until the RLJob goes); `since`:
        the RLJob's creation (older kept messages are an earlier RLJob's of the same name)."""
        if (namespace, job) in self.subscriptions:
            return
        link = self.links.get(namespace, job)
        if link is None:
            raise kopf.TemporaryError("no link to the job's NATS yet", delay=1)
        subs: list[Any] = []
        try:
            on_step, on_done = partial(self.on_step, namespace, job, spec), partial(self.on_done, namespace, job)
            subs.append(await link.subscribe(namespace, job, STEPS, on_step, since))
            subs.append(await link.subscribe(namespace, job, DONE, on_done, since))
        except Exception as err:
            ERRORS.labels("nats").inc()
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            raise kopf.TemporaryError(f"cannot subscribe to the job's NATS at {link.url}: {err}", delay=5) from err
        self.subscriptions[(namespace, job)] = subs

    async def stop(self, namespace: str, job: str) -> None:
        """The RLJob went: unsubscribe, and stop a follower still trying."""
        for sub in self.subscriptions.pop((namespace, job), []):
            with contextlib.suppress(Exception):  # the connection may be gone
                await sub.unsubscribe()
        self._stop_following(namespace, job)

    def _stop_following(self, namespace: str, job: str) -> None:
        self.newest.pop((namespace, job), None)
        for tasks in (self.followers, self.writers):
            task = tasks.pop((namespace, job), None)
            if task is not None:
                task.cancel()

    def close(self) -> None:
        """Stop every follower still trying (the operator stops; its links close after)."""
        for namespace, job in {*self.followers, *self.writers}:
            self._stop_following(namespace, job)

    # --- what the job reports ----------------------------------------------------------------------------

    async def on_step(self, namespace: str, job: str, spec: JobSpec, data: bytes) -> None:
        """Keep the newest report and return: one writer per job writes whichever is newest when it gets to it.
        A status write costs several API calls; a job whose steps come faster than that (a tiny model, a loaded
        API server) had the status minutes behind the trainer, and its backlog held the status lock that a
        suspension or the job's end waits for (the cluster lane saw step 22 while the trainer was at 112)."""
        key, report = (namespace, job), STEPS.decode(data)
        self.newest[key] = superseding(self.newest.get(key), report)
        writer = self.writers.get(key)
        if writer is None or writer.done():
            self.writers[key] = asyncio.create_task(self._write_newest(namespace, job, spec))

    async def _write_newest(self, namespace: str, job: str, spec: JobSpec) -> None:
        while (report := self.newest.pop((namespace, job), None)) is not None:
            try:
                async with self.jobs.status_lock(namespace, job):
                    await self._write_step(namespace, job, spec, report)
            except Exception as err:  # the next report tries again; this one is superseded by then
                ERRORS.labels("status").inc()
                log.warning("step report not written to the status", extra={"job": job, "error": str(err)[:300]})

    async def _write_step(self, namespace: str, job: str, spec: JobSpec, report: StepReport) -> None:
        ref = self.jobs.get(namespace, job)
        spec = ref.spec if ref is not None else spec  # the latest spec: prices may have changed
        kube = self.api.client()
        current = await kube.get("RLJob", namespace, job) or {}
        previous, generation = current.get("status") or {}, status.generation(current)
        if status.finished(previous):  # an ended job's status stays as it ended (no workers, no cost)
            return
        workers, variants = await self._ready_workers(namespace, job, spec)
        patch = status.step_status(report, spec, workers, previous, datetime.now(UTC), generation, variants)
        await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
        if spot_busy.busy_sized(spec):
            await self.sizer.follow_busy(namespace, job, spec, report, previous.get("workers"))

    async def _ready_replicas(self, namespace: str, name: str) -> int:
        dep = await self.api.client().get("Deployment", namespace, name)
        return int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)

    async def _ready_workers(
        self, namespace: str, job: str, spec: JobSpec
    ) -> tuple[dict[str, int], dict[str, int] | None]:
        """Ready workers per pool, and per spot variant (None without variants)."""
        variants = None
        if spec.rollout.spot.variants:
            names = {v.name: children.spot_variant_name(job, v.name) for v in spec.rollout.spot.variants}
            variants = {v: await self._ready_replicas(namespace, name) for v, name in names.items()}
        out = {"reserved": await self._ready_replicas(namespace, children.names(job)["reserved"])}
        out["spot"] = (
            sum(variants.values())
            if variants is not None
            else await self._ready_replicas(namespace, children.names(job)["spot"])
        )
        for pool, n in out.items():
            READY_WORKERS.labels(namespace, job, pool).set(n)
        return out, variants

    async def on_done(self, namespace: str, job: str, data: bytes) -> None:
        writer = self.writers.get((namespace, job))
        if writer is not None and not writer.done():
            await asyncio.wait([writer])  # the last reports first (a status that ended takes no later report)
        async with self.jobs.status_lock(namespace, job):
            await self._write_done(namespace, job, data)

    async def _write_done(self, namespace: str, job: str, data: bytes) -> None:
        done = DONE.decode(data)
        kube = self.api.client()
        current = await kube.get("RLJob", namespace, job)
        if current is None:
            return
        previous = current.get("status") or {}
        if status.finished(previous):  # a repeated `done` (a restarted trainer re-publishes it): keep the first end
            await scale_to_zero(kube, namespace, job, rljob_variants(current))
            return
        outcome = status.done_status(done, previous, generation=status.generation(current))
        event = ("JobSucceeded", f"{done.steps} steps") if done.ok else ("JobFailed", done.error or "trainer failed")
        await end_job(kube, self.sizer, current, outcome, "JobFinished", event, ok=done.ok)


def superseding(older: StepReport | None, newer: StepReport) -> StepReport:
    """The report to write in place of both: the newer one, keeping the older one's validation summary when the
    newer has none (validation runs every few steps; its result must reach .status.validation)."""
    if older is None:
        return newer
    if older.step > newer.step:  # a late report (a restarted trainer's) never replaces a newer one
        return older
    if newer.validation is None and older.validation is not None:
        return newer.model_copy(update={"validation": older.validation})
    return newer
