"""Spot sizing: each running job's spot Deployments sized to its spot ask (spot_ask.py), rescaled as nodes and spot
worker pods come and go, on busy sizing's step reports, when a bound falls due, and by a safety-net loop.

The ask is the spot capacity present (capacity sizing; at most busy sizing's target), or, for autoscaled spot pools,
maxReplicas with a shrink and back-off while pods stay unschedulable. An Event and status.workers say why.
`SpotSizer` (in kopf's memo) owns the sizing state; watches.py passes it the node and pod events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import kopf

from rlboost.spec import JobSpec, SpotPoolSpec
from rlboost.wire.events import StepReport
from rlboost_operator import children, spot, spot_ask, spot_busy, status
from rlboost_operator.config import OperatorSettings
from rlboost_operator.metrics import (
    DESIRED_SPOT,
    ERRORS,
    READY_WORKERS,
    SPOT_NODES,
    SPOT_SHRINKS,
    SPOT_TARGET,
    SPOT_UNSCHEDULABLE,
)
from rlboost_operator.shared import JobKey, JobRef, Jobs, KubeLogin, Nodes

log = logging.getLogger(__name__)


def autoscaled(pool: SpotPoolSpec, settings: OperatorSettings) -> bool:
    """Whether the pool's spot nodes come from an autoscaler: the job's sizing, else the operator's."""
    return (pool.sizing if pool.sizing != "default" else settings.spot_sizing) == "autoscaler"


def ask_settings(settings: OperatorSettings) -> spot_ask.AskSettings:
    s = settings
    return spot_ask.AskSettings(
        s.spot_pending_timeout_s, s.spot_retry_backoff_s, s.spot_retry_backoff_max_s, s.spot_probe_workers
    )


def spot_replicas(job: str, spec: JobSpec, total: int, split: dict[str, int]) -> list[tuple[str, int]]:
    """(Deployment, replicas) of each of the job's spot Deployments for the ask `total` split as `split`."""
    if not spec.rollout.spot.variants:
        return [(children.names(job)["spot"], total)]
    return [(children.spot_variant_name(job, v.name), split.get(v.name, 0)) for v in spec.rollout.spot.variants]


def announce_spot(ref: JobRef, before: int | None, decision: spot_ask.Decision) -> None:
    """An Event saying what the spot ask became and why."""
    change = f"spot workers {before} -> {decision.replicas}: " if before not in (None, decision.replicas) else ""
    post = kopf.warn if decision.shrunk else kopf.info
    post(ref.body(), reason=decision.reason, message=change + decision.message)


def count_spot_nodes(nodes: Nodes) -> None:
    """The spot nodes seen, per provider (every known provider exported, at 0 when none)."""
    counts: dict[str, int] = {}
    for node in nodes.values():
        provider = spot.spot_provider(node)
        if provider:
            counts[provider] = counts.get(provider, 0) + 1
    for provider in {p.split("-")[0] for p in spot.SPOT_LABELS}:
        SPOT_NODES.labels(provider).set(counts.get(provider, 0))


class SpotSizer:
    """Sizes the running jobs' spot Deployments. Owns: the jobs' spot worker pods seen, each autoscaled job's ask
    state machine, busy sizing's targets, and the timers that decide an ask again when a bound falls due."""

    def __init__(self, api: KubeLogin, settings: OperatorSettings, jobs: Jobs, nodes: Nodes) -> None:
        self.api, self.settings, self.jobs, self.nodes = api, settings, jobs, nodes
        self.pods: dict[JobKey, tuple[str, spot_ask.SpotPod]] = {}  # (ns, pod) -> (job, pod)
        self.asks: dict[JobKey, spot_ask.SpotAsk] = {}  # (ns, job) -> its autoscaler state
        self.targets: dict[JobKey, int] = {}  # (ns, job) -> busy sizing's target
        self.rechecks: dict[JobKey, asyncio.Task[None]] = {}  # (ns, job) -> a decision due later

    # --- the ask -----------------------------------------------------------------------------------------

    def decide(
        self,
        namespace: str,
        job: str,
        spec: JobSpec,
        saved: dict[str, Any] | None = None,
        saved_target: int | None = None,
    ) -> spot_ask.Decision:
        """The spot ask now: the capacity present (at most the busy target, for busy sizing), or the job's autoscaler
        state machine fed its pods. `saved` / `saved_target`: the state machine / busy target as the RLJob's status
        kept them (status.workers.spotAsk / spotTarget), taken up when this operator has none (it restarted, or a
        new leader took over), so a back-off, pending bound or busy target carries on."""
        key, pool, pods = (namespace, job), spec.rollout.spot, self.pods_of(namespace, job)
        SPOT_UNSCHEDULABLE.labels(namespace, job).set(sum(1 for p in pods if p.unschedulable_since is not None))
        if not autoscaled(pool, self.settings):
            self.asks.pop(key, None)
            self._recheck_later(namespace, job, None)
            if spot_busy.busy_sized(spec):
                target = self.busy_target(namespace, job, spec, saved_target)
                return spot_busy.busy_decision(self.nodes.values(), spec, target)
            self.targets.pop(key, None)
            return spot_ask.capacity_decision(self.nodes.values(), pool)
        ask = self.asks.get(key)
        if ask is None:
            ask = self.asks[key] = spot_ask.SpotAsk.from_status(ask_settings(self.settings), saved)
        decision = ask.decide(time.time(), pool, pods, self.nodes.doomed())
        if decision.shrunk:
            SPOT_SHRINKS.labels(namespace, job).inc()
        self._recheck_later(namespace, job, decision.recheck_s)
        return decision

    def busy_target(self, namespace: str, job: str, spec: JobSpec, saved: int | None) -> int:
        """Busy sizing's target for the job: this operator's, else the status's, else a fresh one (maxReplicas)."""
        target = self.targets.get((namespace, job))
        if target is None:
            target = self.targets[(namespace, job)] = spot_busy.scaler(spec, saved).target
        SPOT_TARGET.labels(namespace, job).set(target)
        return target

    def split(self, namespace: str, job: str, spec: JobSpec, decision: spot_ask.Decision) -> dict[str, int]:
        """The spot ask per variant of the job's spot pool ({} without variants): spot.variant_split, bounded by
        the variants' nodes, or for an autoscaled pool by the pods each has placed."""
        pool, placed = spec.rollout.spot, None
        if autoscaled(pool, self.settings):
            placed = spot_ask.placed_per_variant(self.pods_of(namespace, job), self.nodes.doomed())
        return spot.variant_split(self.nodes.values(), pool, decision.replicas, placed)

    def spot_status(
        self, namespace: str, job: str, decision: spot_ask.Decision, split: dict[str, int]
    ) -> dict[str, Any]:
        """status.workers' spot fields: the ask, why, the autoscaler state machine (null in capacity mode) and the
        ask per variant (null without variants)."""
        ask = self.asks.get((namespace, job))
        return {
            "spotDesired": decision.replicas,
            "spotReason": decision.reason,
            "spotMessage": decision.message,
            "spotAsk": ask.to_status() if ask is not None else None,
            "spotTarget": self.targets.get((namespace, job)),
            "spotSplit": status.variant_list(split, "replicas") if split else None,
        }

    # --- the jobs sized ----------------------------------------------------------------------------------

    def remember(self, ref: JobRef, decision: spot_ask.Decision, split: dict[str, int]) -> None:
        """Keep a running job (its spot Deployments written at `decision`) for rescaling; say so when its spot ask
        is new or changed."""
        workers_status = self.spot_status(ref.namespace, ref.name, decision, split)
        ref.spot_replicas, ref.spot_reason = decision.replicas, decision.reason
        ref.spot_ask, ref.spot_target, ref.spot_split = workers_status["spotAsk"], workers_status["spotTarget"], split
        known = self.jobs.put(ref)
        if known is None or (known.spot_replicas, known.spot_reason) != (decision.replicas, decision.reason):
            announce_spot(ref, known.spot_replicas if known else None, decision)
        DESIRED_SPOT.labels(ref.namespace, ref.name).set(decision.replicas)

    def drop(self, namespace: str, name: str) -> None:
        """Stop scaling a job (it ended or went away) and drop its gauges."""
        self.asks.pop((namespace, name), None)
        self.targets.pop((namespace, name), None)
        self._recheck_later(namespace, name, None)
        if self.jobs.pop(namespace, name) is not None:
            DESIRED_SPOT.remove(namespace, name)
        for series in (SPOT_SHRINKS, SPOT_UNSCHEDULABLE, SPOT_TARGET):
            with contextlib.suppress(KeyError):
                series.remove(namespace, name)
        for pool in ("reserved", "spot"):
            with contextlib.suppress(KeyError):
                READY_WORKERS.remove(namespace, name, pool)

    def pods_of(self, namespace: str, job: str) -> list[spot_ask.SpotPod]:
        """The job's live spot worker pods."""
        return [pod for (ns, _), (j, pod) in self.pods.items() if ns == namespace and j == job]

    def track_pod(self, deleted: bool, pod: dict[str, Any], namespace: str, name: str, job: str) -> bool:
        """Keep the job's spot worker pods (node, or unschedulable since when); True if this one changed."""
        key = (namespace, name)
        known = self.pods.get(key)
        if deleted or not spot_ask.counts_as_spot_worker(pod):
            return self.pods.pop(key, None) is not None
        since = known[1].unschedulable_since if known and known[1].unschedulable_since is not None else time.time()
        current = (job, spot_ask.spot_pod(pod, since))
        self.pods[key] = current
        return current != known

    # --- rescaling ---------------------------------------------------------------------------------------

    async def rescale(self, ref: JobRef, force: bool = False) -> None:
        """Scale the job's spot Deployments to the spot ask; an Event and the status say why.

        `force` writes the ask even if it did not change (the timer's safety net)."""
        decision = self.decide(ref.namespace, ref.name, ref.spec)
        split = self.split(ref.namespace, ref.name, ref.spec, decision)
        before, reason = ref.spot_replicas, ref.spot_reason
        workers_status = self.spot_status(ref.namespace, ref.name, decision, split)
        state = (workers_status["spotAsk"], workers_status["spotTarget"], split)
        unchanged = (before, reason, (ref.spot_ask, ref.spot_target, ref.spot_split)) == (
            decision.replicas,
            decision.reason,
            state,
        )
        if not force and unchanged:
            return
        ref.spot_replicas, ref.spot_reason = decision.replicas, decision.reason
        ref.spot_ask, ref.spot_target, ref.spot_split = state
        kube = self.api.client()
        if self.jobs.get(ref.namespace, ref.name) is not ref:
            return  # the job ended (scaled to zero) or was reconciled anew meanwhile: its own write wins
        for name, replicas in spot_replicas(ref.name, ref.spec, decision.replicas, split):
            await kube.patch("Deployment", ref.namespace, name, {"spec": {"replicas": replicas}})
        await kube.patch("RLJob", ref.namespace, ref.name, {"status": {"workers": workers_status}}, sub="status")
        DESIRED_SPOT.labels(ref.namespace, ref.name).set(decision.replicas)
        if (before, reason) != (decision.replicas, decision.reason):
            announce_spot(ref, before, decision)

    async def rescale_job(self, ref: JobRef, force: bool = False) -> None:
        """rescale(), with a failure counted and logged; the next event or timer tick tries again."""
        try:
            await self.rescale(ref, force)
        except Exception:
            ERRORS.labels("rescale").inc()
            ref.spot_replicas = None
            log.exception("rescaling failed", extra={"job": ref.name, "namespace": ref.namespace})

    async def rescale_all(self) -> None:
        for ref in self.jobs.running():
            await self.rescale_job(ref)

    async def rescale_known(self, namespace: str, job: str) -> None:
        """Rescale the job if it runs (an ended or unknown one is not sized)."""
        ref = self.jobs.get(namespace, job)
        if ref is not None:
            await self.rescale_job(ref)

    async def follow_busy(
        self, namespace: str, job: str, spec: JobSpec, report: StepReport, workers_status: dict[str, Any] | None
    ) -> None:
        """Busy sizing: the step report moves the job's target; the spot Deployment follows it (rescale)."""
        target = self.busy_target(namespace, job, spec, spot_busy.saved_target(workers_status))
        self.targets[(namespace, job)] = new = spot_busy.next_target(spec, target, report)
        SPOT_TARGET.labels(namespace, job).set(new)
        await self.rescale_known(namespace, job)

    async def run(self) -> None:
        """Safety net: rescale every job even if a node event was missed. One loop for all jobs, started with the
        operator: a per-RLJob kopf timer would put a finalizer on every RLJob."""
        while True:
            await asyncio.sleep(self.settings.rescale_interval_s)
            for ref in self.jobs.running():
                await self.rescale_job(
                    ref, force=True
                )  # written even if unchanged: the Deployment may have been edited

    # --- decisions due later -----------------------------------------------------------------------------

    def _recheck_later(self, namespace: str, job: str, delay_s: float | None) -> None:
        """Decide the job's spot ask again after `delay_s` (a pending bound or a retry falls due with no event)."""
        previous = self.rechecks.pop((namespace, job), None)
        if previous is not None:
            previous.cancel()  # still sleeping: a recheck that woke up has left the dict
        if delay_s is not None:
            self.rechecks[(namespace, job)] = asyncio.create_task(self._recheck(namespace, job, delay_s))

    async def _recheck(self, namespace: str, job: str, delay_s: float) -> None:
        key = (namespace, job)
        await asyncio.sleep(delay_s + 0.05)  # just past the bound, not just before it
        if self.rechecks.get(key) is asyncio.current_task():
            del self.rechecks[key]  # awake: a newer decision must not cancel it halfway through its writes
        await self.rescale_known(namespace, job)

    def close(self) -> None:
        """Cancel every decision still due (the operator stops)."""
        for task in self.rechecks.values():
            task.cancel()
        self.rechecks.clear()
