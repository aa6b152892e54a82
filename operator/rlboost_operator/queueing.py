"""The job's Kueue Workload through the API (kueue.py decides what it holds and what Kueue's conditions mean):
made when a queued job is reconciled, replaced while it waits when what it asks for changed, read for Kueue's
decision, its quota given back once an evicted job stopped, and marked Finished when the job ends. `Queueing` sits
in kopf's memo; it does nothing unless the operator's `kueue` setting is on."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf

from rlboost_operator import kueue, status
from rlboost_operator.checks import SpecProblemError
from rlboost_operator.config import OperatorSettings
from rlboost_operator.kube import Kube
from rlboost_operator.shared import KubeLogin

PRIORITY_FIELD = f'metadata.labels["{kueue.PRIORITY_LABEL}"]'


class Queueing:
    """The operator's side of Kueue's external-framework contract, for every queued RLJob."""

    def __init__(self, api: KubeLogin, settings: OperatorSettings) -> None:
        self.api, self.settings = api, settings
        self.seen: dict[tuple[str, str], tuple[bool, bool, bool]] = {}  # Workload -> Kueue's decision last acted on
        self.finished: set[tuple[str, str]] = set()  # RLJobs whose Workload was marked Finished

    def changed(self, namespace: str, workload: dict[str, Any]) -> bool:
        """Whether Kueue's decision on `workload` (admitted, evicted, quota reserved) differs from the one last acted
        on (kueue_watch.py reconciles the job only then)."""
        state = kueue.admission(workload)
        decision = (state.admitted, state.evicted is not None, state.quota_reserved)
        key = (namespace, state.name)
        before, self.seen[key] = self.seen.get(key), decision
        return before != decision

    def forget(self, namespace: str, job: str) -> None:
        """The RLJob went (its Workloads go with it)."""
        self.finished.discard((namespace, job))
        self.seen = {k: v for k, v in self.seen.items() if k[0] != namespace or not k[1].startswith(f"rljob-{job}-")}

    async def follow_end(self, rljob: Mapping[str, Any]) -> None:
        """An RLJob event: once the job ended, its Workload Finished (once per job and operator run)."""
        meta, st = rljob.get("metadata") or {}, rljob.get("status") or {}
        key = (meta.get("namespace") or "default", meta.get("name") or "")
        if key in self.finished or not st.get("kueue") or not status.finished(st):
            return
        await self.finish(rljob, st.get("phase") == status.SUCCEEDED, f"RLJob {key[1]} {st.get('phase')}")
        self.finished.add(key)

    def queue(self, labels: Mapping[str, str] | None) -> str:
        """The job's LocalQueue; '' when it is not queued (no label, or the operator's Kueue integration off)."""
        return kueue.queue_name(labels) if self.settings.kueue else ""

    async def sync(self, rljob: Any, objs: list[dict[str, Any]], previous: Mapping[str, Any]) -> kueue.Admission | None:
        """The job's Workload as Kueue left it, made (asking for `objs`: the children as they run) if needed; None
        when the job is not queued. `rljob`: the RLJob (a kopf Body), `previous`: its status."""
        meta = rljob["metadata"]
        labels, namespace, job = meta.get("labels") or {}, meta.get("namespace") or "default", meta["name"]
        if not self.queue(labels):
            return None
        kube = self.api.client()
        desired = kueue.workload(job, namespace, objs, labels, await self._priority(kube, labels))
        current_name = (previous.get("kueue") or {}).get("workload") or ""
        current = await kube.get("Workload", namespace, current_name) if current_name else None
        if current is not None and (current_name == desired["metadata"]["name"] or kueue.admission(current).admitted):
            return kueue.admission(current)  # unchanged; or running on it: a new ask waits for the next admission
        if current is not None:
            await kube.patch("Workload", namespace, current_name, {"spec": {"active": False}})
        return kueue.admission(await self._ensure(kube, rljob, desired))

    async def _ensure(self, kube: Kube, rljob: Any, desired: dict[str, Any]) -> dict[str, Any]:
        meta = desired["metadata"]
        found = await kube.get("Workload", meta["namespace"], meta["name"])
        if found is None:
            kopf.adopt(desired, owner=rljob)
            return await kube.create(desired) or desired
        if (found.get("spec") or {}).get("active") is False:  # an edit reverted: its old Workload fits again
            await kube.patch("Workload", meta["namespace"], meta["name"], {"spec": {"active": True}})
        return found

    async def _priority(self, kube: Kube, labels: Mapping[str, str]) -> int | None:
        name = kueue.priority_class(labels)
        if not name:
            return None
        found = await kube.get_cluster("WorkloadPriorityClass", name)
        if found is None:
            raise SpecProblemError(
                PRIORITY_FIELD,
                f"no WorkloadPriorityClass {name!r} (kubectl get workloadpriorityclasses): create it, or fix the label",
            )
        return int(found.get("value") or 0)

    async def flavors(self, state: kueue.Admission) -> dict[str, dict[str, Any]]:
        """The spec of every ResourceFlavor Kueue assigned (a flavor gone since counts as empty)."""
        kube = self.api.client()
        return {
            name: ((await kube.get_cluster("ResourceFlavor", name)) or {}).get("spec") or {}
            for name in sorted(state.flavor_names())
        }

    async def release(self, namespace: str, job: str) -> None:
        """An evicted Workload whose job stopped: give its quota back so Kueue requeues it (once)."""
        found = await self._workload(namespace, job)
        if found is None:
            return
        state = kueue.admission(found)
        if state.evicted is not None and state.quota_reserved:
            patch = kueue.released_status(found, datetime.now(UTC))
            await self.api.client().patch("Workload", namespace, state.name, {"status": patch}, sub="status")

    async def finish(self, rljob: Mapping[str, Any], ok: bool, message: str) -> None:
        """The job ended: its Workload Finished (frees the quota), unless it has none or is finished already."""
        meta = rljob.get("metadata") or {}
        found = await self._workload(meta.get("namespace") or "default", meta.get("name") or "", rljob)
        if found is not None and not kueue.admission(found).finished:
            patch = kueue.finished_status(found, ok, message, datetime.now(UTC))
            name, namespace = found["metadata"]["name"], found["metadata"].get("namespace") or "default"
            await self.api.client().patch("Workload", namespace, name, {"status": patch}, sub="status")

    async def _workload(
        self, namespace: str, job: str, rljob: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The Workload the RLJob's status names (read from the API unless `rljob` is given)."""
        if not self.settings.kueue:
            return None
        kube = self.api.client()
        rljob = rljob if rljob is not None else await kube.get("RLJob", namespace, job)
        name = (((rljob or {}).get("status") or {}).get("kueue") or {}).get("workload")
        return await kube.get("Workload", namespace, name) if name else None


def kueue_status(state: kueue.Admission | None, queue: str) -> dict[str, Any] | None:
    """`.status.kueue`: the Workload, its queue, and whether Kueue admits the job."""
    if state is None:
        return None
    return {"workload": state.name, "queueName": queue, "clusterQueue": state.cluster_queue, "admitted": state.admitted}


def adopt_spot_freely(obj: dict[str, Any], queued: bool) -> None:
    """A queued job's spot Deployments: owned by the RLJob (deleted with it) but not controlled by it, so Kueue's
    deployment integration admits each spot pod on its own (kueue.py)."""
    if queued and kueue.is_spot(obj):
        for ref in obj["metadata"].get("ownerReferences") or []:
            ref["controller"] = False
