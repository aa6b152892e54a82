"""An RLJob's lifecycle: create, update and resume reconcile it; a deleted one is forgotten; it ends on its pods.

- Reconcile: validate (checks.py; a bad spec is Failed naming the field), check that the model's claim or token
  Secret exists (model_source.py; looked for again every MODEL_RECHECK_S), make the job's credentials and keep its
  workers' identity item current (credentials.py; no children until it is there), judge whether the job is held
  (holds.py: spec.suspend, or Kueue not admitting it, through its Workload: queueing.py), build the children
  (children/, with the RLJob's labels), adopt them (ownerReferences: deletion is garbage collection) and create or
  patch them, at the spot ask (sizing.py), or at zero replicas once the job ended or while it is held and has
  stopped; a held job still running is suspended first (suspension.py: the trainer checkpoints at a step boundary);
  then follow its status (status_stream.py).
- The end of a job on its pods: a `fetch-model` init container that gave up (no such repo, refused credentials;
  unreachable after model_source.FETCH_ATTEMPTS tries) ends it Failed with a ModelReady condition naming the
  spec.model field; trainer pods restarting past trainer.backoffLimit end it Failed (job_end.py).
- No RLJob carries a finalizer: nothing here is per-object kopf machinery (daemons, timers, mandatory delete
  handlers would each add one), so an RLJob deletes even when no operator runs.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, NoReturn

import kopf

from rlboost.spec import JobSpec
from rlboost_operator import children, cluster_keys, holds, job_metrics, kueue, model_source, render, spot_busy, status
from rlboost_operator.checks import SpecProblemError, check_job, check_labels
from rlboost_operator.credentials import IDENTITY_READY, WorkerIdentity, ensure_credentials
from rlboost_operator.gate import forget_job_nats, judge_hold, suspend_early
from rlboost_operator.job_end import end_job, patch_if_present, status_variants
from rlboost_operator.kube import Kube
from rlboost_operator.metrics import ERRORS, RECONCILIATIONS
from rlboost_operator.queueing import Queueing, adopt_spot_freely
from rlboost_operator.shared import RLJOB, JobKey, JobLinks, JobRef, Jobs, KubeLogin
from rlboost_operator.sizing import SpotSizer
from rlboost_operator.status_stream import StatusStream
from rlboost_operator.suspension import Suspender

log = logging.getLogger(__name__)
MODEL_RECHECK_S = 30  # a missing claim or token Secret is looked for again this often


class TrainerFailures:
    """How often each trainer pod failed (its restarts, as status.trainer_failures counts them), per job."""

    def __init__(self) -> None:
        self._counts: dict[JobKey, tuple[str, int]] = {}  # (ns, pod) -> (job, failures)

    def seen(self, namespace: str, pod: str, job: str, failures: int) -> None:
        self._counts[(namespace, pod)] = (job, failures)

    def gone(self, namespace: str, pod: str) -> None:
        self._counts.pop((namespace, pod), None)

    def most(self, namespace: str, job: str) -> int:
        """The most failures any of the job's trainer ranks had (ranks die together; a sum would count one
        failure once per rank)."""
        counts = [n for (ns, _), (j, n) in self._counts.items() if ns == namespace and j == job]
        return max(counts, default=0)

    def forget_job(self, namespace: str, job: str) -> None:
        self._counts = {k: v for k, v in self._counts.items() if (k[0], v[0]) != (namespace, job)}


@kopf.on.create(*RLJOB)
@kopf.on.update(*RLJOB, field="spec")
@kopf.on.update(*RLJOB, field="metadata.labels")  # they reach every child (and Kueue reads its queue there)
@kopf.on.resume(*RLJOB)
async def rljob_reconcile(body: kopf.Body, spec: kopf.Spec, memo: kopf.Memo, **_: Any) -> None:
    try:
        await reconcile(memo, body, spec)
    except (kopf.PermanentError, kopf.TemporaryError):
        raise
    except Exception as err:
        ERRORS.labels("reconcile").inc()
        raise kopf.TemporaryError(f"reconcile failed: {err}", delay=5) from err


@kopf.on.event(*RLJOB)
async def rljob_event(
    event: dict[str, Any], body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **_: Any
) -> None:
    """Every change: the job's gauges (job_metrics.py), and its Workload Finished once it ended (queueing.py). A
    deleted RLJob: children go by garbage collection (ownerReferences); forget the job here. A watch event, not a
    delete handler: kopf calls those only for objects it holds with a finalizer, and RLJobs carry none."""
    queueing: Queueing = memo.queueing
    if event.get("type") != "DELETED":
        job_metrics.observe(namespace, name, body)
        await queueing.follow_end(body)
        return
    job_metrics.forget(namespace, name)
    queueing.forget(namespace, name)
    suspender: Suspender = memo.suspender
    suspender.cancel(namespace, name)
    sizer: SpotSizer = memo.sizer
    sizer.drop(namespace, name)
    stream: StatusStream = memo.stream
    await stream.stop(namespace, name)
    links: JobLinks = memo.links
    await links.close(namespace, name)
    jobs: Jobs = memo.jobs
    jobs.forget_status_lock(namespace, name)
    trainers: TrainerFailures = memo.trainers
    trainers.forget_job(namespace, name)


# --- reconciling ----------------------------------------------------------------------------------------


async def reconcile(memo: kopf.Memo, body: kopf.Body, spec_data: Any) -> None:
    """Validate, then create or patch every child of the RLJob (at zero replicas once the job ended), and follow
    a running job's status subjects."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    api: KubeLogin = memo.api
    try:
        spec = check_job(dict(spec_data or {}), memo.settings)
        check_labels(body.metadata.labels)
    except SpecProblemError as problem:
        await fail(memo, body, problem)
    missing = await model_source.missing_model_objects(api.client().get, namespace, spec.model)
    if missing is not None:
        await model_unavailable(memo, body, missing)
    jobs: Jobs = memo.jobs
    await suspend_early(memo, body, spec)
    async with jobs.status_lock(namespace, job):  # judged on the status as it is now, not as the event saw it
        try:
            stopped = await apply_children(memo, body, spec)
        except SpecProblemError as problem:  # a label naming a Kueue object that does not exist
            await fail(memo, body, problem, locked=True)
    if not stopped:
        stream: StatusStream = memo.stream
        stream.follow_soon(namespace, job, spec, status.parse_iso(body.metadata.get("creationTimestamp")))
    RECONCILIATIONS.labels("ok").inc()


async def fail(memo: kopf.Memo, body: kopf.Body, problem: SpecProblemError, locked: bool = False) -> NoReturn:
    """Phase Failed (unless the job already ended), a condition and a Warning Event naming the field; then stop
    retrying. `locked`: the caller holds the job's status lock."""
    RECONCILIATIONS.labels("invalid").inc()
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    jobs: Jobs = memo.jobs
    jobs.pop(namespace, name)
    kube: Kube = memo.api.client()
    async with contextlib.nullcontext() if locked else jobs.status_lock(namespace, name):
        previous = ((await kube.get("RLJob", namespace, name)) or {}).get("status") or {}
        patch = status.invalid_status(problem.field, str(problem), previous)
        await kube.patch("RLJob", namespace, name, {"status": patch}, sub="status")
    kopf.warn(body, reason="InvalidSpec", message=f"{problem.path}: {problem}")
    raise kopf.PermanentError(f"{problem.path}: {problem}")


async def model_unavailable(memo: kopf.Memo, body: kopf.Body, problem: model_source.ModelProblem) -> None:
    """Phase Failed with a ModelReady condition naming the field; checked again later (the claim or Secret may be
    created after the RLJob, e.g. by the same `kubectl apply`), so the job starts once it exists."""
    RECONCILIATIONS.labels("model-unavailable").inc()
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    jobs: Jobs = memo.jobs
    jobs.pop(namespace, name)
    await write_model_failure(memo.api.client(), body, problem)
    raise kopf.TemporaryError(f"spec.model.{problem.field}: {problem.message}", delay=MODEL_RECHECK_S)


async def write_model_failure(kube: Kube, rljob: Any, problem: model_source.ModelProblem) -> None:
    """Failed + the ModelReady condition and a Warning Event on `rljob` (a kopf Body or the object as read), unless
    the RLJob says so already."""
    meta, previous, generation = rljob.get("metadata") or {}, dict(rljob.get("status") or {}), status.generation(rljob)
    message = f"spec.model.{problem.field}: {problem.message}"
    if previous.get("phase") == status.FAILED and any(
        c.get("type") == "ModelReady" and c.get("message") == message for c in previous.get("conditions") or []
    ):
        return
    patch = status.model_failed_status(problem.field, problem.reason, problem.message, previous, generation=generation)
    await kube.patch("RLJob", meta.get("namespace") or "default", meta["name"], {"status": patch}, sub="status")
    kopf.warn(rljob, reason=problem.reason, message=message)


async def apply_children(memo: kopf.Memo, body: kopf.Body, spec: JobSpec) -> bool:
    """Create or patch the children and write the status; True when the job runs no pod now: it ended, or it is
    held (holds.py) and has stopped (kept at zero)."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    kube: Kube = memo.api.client()
    sizer: SpotSizer = memo.sizer
    previous = ((await kube.get("RLJob", namespace, job)) or {}).get("status") or {}
    ended, saved = status.finished(previous), previous.get("workers") or {}
    gate = await judge_hold(memo, body, spec, previous, ended)
    stopped = ended or (gate.hold is not None and holds.never_ran(previous))
    decision = (
        None if stopped else sizer.decide(namespace, job, spec, saved.get("spotAsk"), spot_busy.saved_target(saved))
    )
    split = sizer.split(namespace, job, spec, decision) if decision else {}
    if gate.hold is None and holds.suspended(previous):
        await forget_job_nats(memo, namespace, job)  # its NATS restarts empty: link and status stream anew
    items = await ensure_credentials(kube, memo.links, namespace, job, body)
    identity: WorkerIdentity = memo.identity
    has_identity = await identity.ensure(body, items, stopped)
    replicas = decision.replicas if decision else 0
    labels = children.job_labels(body.metadata.labels)
    built = children.build_children(
        job, namespace, spec, memo.settings, replicas, finished=stopped, spot_split=split, job_labels=labels
    )
    if not stopped and gate.state is not None:
        queueing: Queueing = memo.queueing
        kueue.place(built, gate.state, await queueing.flavors(gate.state))
    for child in render.owned(built, body):
        adopt_spot_freely(child, gate.state is not None)
        await kube.apply(child)
    await retire_spot(kube, namespace, job, spec, status_variants(saved))
    if decision is None:
        sizer.drop(namespace, job)
    else:
        sizer.remember(JobRef(namespace, job, body.metadata.uid or "", spec), decision, split)
    patch = reconciled_status(previous, replicas, status.generation(body), has_identity, spec.algorithm.steps)
    patch.update(gate.status(previous, patch, stopped, status.generation(body)))
    if decision is not None:
        patch["workers"].update(sizer.spot_status(namespace, job, decision, split))
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    await gate.follow_up(memo, namespace, job, stopped)
    return stopped


def reconciled_status(
    previous: dict[str, Any], replicas: int, generation: int | None, has_identity: bool, steps_total: int
) -> dict[str, Any]:
    """The status patch after the children were applied: reconcile_status, less a model pre-check failure that no
    longer holds (the claim or Secret exists now), with WorkerIdentityReady True once the keys are written."""
    previous = {**previous, "conditions": model_source.without_precheck_failure(previous.get("conditions"))}
    patch = status.reconcile_status(previous, replicas, generation, steps_total=steps_total)
    if has_identity:
        ready = status.condition(cluster_keys.CONDITION, True, "KeysWritten", IDENTITY_READY, None, generation)
        patch["conditions"] = status.set_condition(patch["conditions"], ready)
    return patch


async def retire_spot(kube: Kube, namespace: str, job: str, spec: JobSpec, previous_variants: list[str]) -> None:
    """Scale to zero the spot Deployments an edit of rollout.spot.variants left behind: variants gone from the
    spec, the pool's single Deployment once there are variants (it may not exist: fine)."""
    current = set(children.spot_deployments(job, spec))
    names = [children.spot_variant_name(job, v) for v in previous_variants]
    if spec.rollout.spot.variants:
        names.append(children.names(job)["spot"])
    for name in dict.fromkeys(n for n in names if n not in current):
        await patch_if_present(kube, "Deployment", namespace, name, {"spec": {"replicas": 0}})


# --- the end of a job on its pods -----------------------------------------------------------------------


async def fetch_failed(memo: kopf.Memo, namespace: str, job: str, pod: str, problem: model_source.ModelProblem) -> None:
    """A job pod's fetcher gave up: the job ends Failed (ModelReady=False naming the spec.model field) and is
    scaled to zero, so no pod crash-loops on a source that cannot work."""
    jobs: Jobs = memo.jobs
    async with jobs.status_lock(namespace, job):
        kube: Kube = memo.api.client()
        current = await kube.get("RLJob", namespace, job)
        if current is None or status.finished(current.get("status") or {}):
            return  # gone, or ended already (every failing pod of the job reports it)
        log.warning(
            "model fetch failed", extra={"job": job, "pod": pod, "field": problem.field, "reason": problem.reason}
        )
        previous, generation = current.get("status") or {}, status.generation(current)
        outcome = status.model_failed_status(
            problem.field, problem.reason, problem.message, previous, generation=generation, ended=True
        )
        message = f"spec.model.{problem.field}: {problem.message}"
        await end_job(kube, memo.sizer, current, outcome, "ModelUnavailable", (problem.reason, message), ok=False)


async def watch_trainer(
    memo: kopf.Memo, event: dict[str, Any], pod: kopf.Body, namespace: str, name: str, labels: kopf.Labels
) -> None:
    """Count a trainer pod's failures; past the job's trainer.backoffLimit the job is Failed and scaled to zero."""
    if labels.get("app.kubernetes.io/component") != "trainer":
        return
    trainers: TrainerFailures = memo.trainers
    if event.get("type") == "DELETED":
        trainers.gone(namespace, name)
        return
    job = labels["rlboost.io/job"]
    before = trainers.most(namespace, job)
    trainers.seen(namespace, name, job, status.trainer_failures(pod))
    jobs: Jobs = memo.jobs
    ref, failures = jobs.get(namespace, job), trainers.most(namespace, job)
    if failures != before:  # status.trainerRestarts (and the gauge made of it)
        restarts = {"status": {"trainerRestarts": failures}}
        await patch_if_present(memo.api.client(), "RLJob", namespace, job, restarts, sub="status")
    if ref is None or not status.backoff_exceeded(failures, ref.spec.trainer.backoff_limit):
        return
    async with jobs.status_lock(namespace, job):
        await _end_on_backoff(memo, ref, failures)


async def _end_on_backoff(memo: kopf.Memo, ref: JobRef, failures: int) -> None:
    """The job's trainer failed past its backoffLimit: Failed and scaled to zero, unless it ended already. Called
    with the job's status lock held."""
    kube: Kube = memo.api.client()
    current = await kube.get("RLJob", ref.namespace, ref.name)
    if current is None or status.finished(current.get("status") or {}):
        return
    limit = ref.spec.trainer.backoff_limit
    outcome = status.backoff_status(failures, limit, current.get("status") or {}, generation=status.generation(current))
    message = outcome["conditions"][-1]["message"]
    await end_job(
        kube, memo.sizer, current, outcome, "BackoffLimitExceeded", ("BackoffLimitExceeded", message), ok=False
    )
