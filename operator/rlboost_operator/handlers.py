"""kopf handlers of the rlboost operator. Thin: they route watch events to pure builders and the API.

Run: `kopf run -A -m rlboost_operator.handlers` (or `python -m rlboost_operator`).
- RLJob create/update/resume: validate (rlboost_operator.checks), check that the model's claim or token Secret
  exists (model_source.py), build children (children.py), adopt them (ownerReferences: deletion is garbage
  collection), create or patch.
- Job pods: a `fetch-model` init container that failed (no such repo, refused credentials, unreachable URI)
  makes the RLJob Failed with a ModelReady condition naming the spec.model field, instead of a silent crash loop.
- Nodes: spot nodes are counted per job's pool (spot.py) and the spot Deployment scaled;
  preemption signals become NATS notices naming the node and the job's pods on it.
- A daemon per RLJob subscribes to the job's `steps` and `done` subjects and writes .status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from datetime import UTC, datetime
from typing import Any

import kopf

from rlboost.spec import JobSpec
from rlboost.wire.events import JobDone, PreemptionNotice, StepReport
from rlboost_operator import children, model_source, spot, status
from rlboost_operator.checks import SpecProblemError, check_job
from rlboost_operator.config import load_settings
from rlboost_operator.kube import Kube
from rlboost_operator.metrics import DESIRED_SPOT, ERRORS, NOTICES, READY_WORKERS, RECONCILIATIONS, SPOT_NODES
from rlboost_operator.notices import NatsLink
from rlboost_operator.state import JobRef, State

log = logging.getLogger(__name__)
RLJOB = ("rlboost.io", "v1alpha1", "rljobs")
MODEL_RECHECK_S = 30  # a missing claim or token Secret is looked for again this often
JOB_POD_LABELS = {"rlboost.io/job": kopf.PRESENT}

STATE = State(settings=load_settings())


def _kube() -> Kube:
    if STATE.kube is None:
        raise kopf.TemporaryError("not logged in to the Kubernetes API yet", delay=1)
    return STATE.kube


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log in like kopf would (service account, else kubeconfig) and keep the result for our client."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        STATE.kube = Kube(info)
    return info


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = "rlboost.io/operator"
    settings.posting.level = logging.INFO  # scaling and preemption Events are Normal events
    # A fresh view each run: kopf re-lists every watched object at start.
    STATE.settings = load_settings()
    STATE.nodes.clear(), STATE.pods.clear(), STATE.jobs.clear(), STATE.notified.clear(), STATE.status_locks.clear()
    STATE.nats = NatsLink(STATE.settings.nats_url)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if STATE.nats is not None:
        await STATE.nats.close()
    if STATE.kube is not None:
        await STATE.kube.close()


# --- RLJob reconciliation -------------------------------------------------------------------


async def _fail(body: kopf.Body, problem: SpecProblemError) -> None:
    """Phase Failed, a condition and a Warning Event naming the field; then stop retrying."""
    RECONCILIATIONS.labels("invalid").inc()
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    STATE.jobs.pop((namespace, name), None)
    await _kube().patch(
        "RLJob", namespace, name, {"status": status.invalid_status(problem.field, str(problem))}, sub="status"
    )
    kopf.warn(body, reason="InvalidSpec", message=f"spec.{problem.field}: {problem}")
    raise kopf.PermanentError(f"spec.{problem.field}: {problem}")


async def _model_unavailable(body: kopf.Body, problem: model_source.ModelProblem) -> None:
    """Phase Failed with a ModelReady condition naming the field; checked again later (the claim or Secret may be
    created after the RLJob, e.g. by the same `kubectl apply`), so the job starts once it exists."""
    RECONCILIATIONS.labels("model-unavailable").inc()
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    STATE.jobs.pop((namespace, name), None)
    await _write_model_failure(body, problem)
    raise kopf.TemporaryError(f"spec.model.{problem.field}: {problem.message}", delay=MODEL_RECHECK_S)


async def _write_model_failure(rljob: Any, problem: model_source.ModelProblem) -> None:
    """Failed + the ModelReady condition and a Warning Event on `rljob` (a kopf Body or the object as read), unless
    the RLJob says so already."""
    meta, previous, generation = rljob.get("metadata") or {}, dict(rljob.get("status") or {}), _generation(rljob)
    message = f"spec.model.{problem.field}: {problem.message}"
    if previous.get("phase") == status.FAILED and any(
        c.get("type") == "ModelReady" and c.get("message") == message for c in previous.get("conditions") or []
    ):
        return
    patch = status.model_failed_status(problem.field, problem.reason, problem.message, previous, generation=generation)
    await _kube().patch("RLJob", meta.get("namespace") or "default", meta["name"], {"status": patch}, sub="status")
    kopf.warn(rljob, reason=problem.reason, message=message)


async def _ensure_token(namespace: str, job: str, body: kopf.Body) -> None:
    """The job's upload token: generated once, never rewritten (running pods hold it)."""
    kube = _kube()
    if await kube.get("Secret", namespace, children.names(job)["token"]) is None:
        secret = children.token_secret(job, namespace, secrets.token_urlsafe(32))
        kopf.adopt(secret, owner=body)
        await kube.create(secret)


def _spot_replicas(spec: JobSpec) -> int:
    return spot.desired_spot_replicas(STATE.nodes.values(), spec.rollout.spot)


async def reconcile(body: kopf.Body, spec_data: Any) -> None:
    """Validate, then create or patch every child of the RLJob."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    try:
        spec = check_job(dict(spec_data or {}), STATE.settings)
    except SpecProblemError as problem:
        await _fail(body, problem)
    kube = _kube()
    missing = await model_source.missing_model_objects(kube.get, namespace, spec.model)
    if missing is not None:
        await _model_unavailable(body, missing)
    replicas = _spot_replicas(spec)
    await _ensure_token(namespace, job, body)
    for child in children.build_children(job, namespace, spec, STATE.settings, replicas):
        kopf.adopt(child, owner=body)
        await kube.apply(child)
    STATE.jobs[(namespace, job)] = JobRef(namespace, job, body.metadata.uid or "", spec, replicas)
    DESIRED_SPOT.labels(namespace, job).set(replicas)
    previous = dict(body.get("status") or {})
    patch: dict[str, Any] = {
        "workers": {**dict(previous.get("workers") or {}), "spotDesired": replicas},
        "conditions": status.set_condition(
            model_source.without_precheck_failure(previous.get("conditions")),  # the claim or Secret exists now
            status.condition(
                "Valid", True, "SpecAccepted", "spec is valid; children reconciled", generation=_generation(body)
            ),
        ),
        "updatedAt": status.now_iso(),
        "observedGeneration": _generation(body),
    }
    if previous.get("phase") in (None, status.FAILED):
        patch["phase"] = status.PENDING
    patch.setdefault("startedAt", previous.get("startedAt") or status.now_iso())
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    RECONCILIATIONS.labels("ok").inc()


def _generation(obj: Any) -> int | None:
    """metadata.generation of an RLJob (a kopf Body or a plain dict); None where the API server sets none."""
    generation = (obj.get("metadata") or {}).get("generation")
    return int(generation) if generation is not None else None


@kopf.on.create(*RLJOB)
@kopf.on.update(*RLJOB, field="spec")
@kopf.on.resume(*RLJOB)
async def rljob_reconcile(body: kopf.Body, spec: kopf.Spec, **_: Any) -> None:
    try:
        await reconcile(body, spec)
    except (kopf.PermanentError, kopf.TemporaryError):
        raise
    except Exception as err:
        ERRORS.labels("reconcile").inc()
        raise kopf.TemporaryError(f"reconcile failed: {err}", delay=5) from err


@kopf.on.delete(*RLJOB, optional=True)
async def rljob_deleted(namespace: str, name: str, **_: Any) -> None:
    """Children go by garbage collection (ownerReferences); only forget the job here."""
    if STATE.jobs.pop((namespace, name), None) is not None:
        DESIRED_SPOT.remove(namespace, name)
        for pool in ("reserved", "spot"):
            with contextlib.suppress(KeyError):
                READY_WORKERS.remove(namespace, name, pool)


# --- Spot pools and preemption --------------------------------------------------------------


async def rescale(ref: JobRef) -> None:
    """Scale the job's spot Deployment to the capacity present, within [min, max]."""
    desired = _spot_replicas(ref.spec)
    if desired == ref.spot_replicas:
        return
    before, ref.spot_replicas = ref.spot_replicas, desired
    kube = _kube()
    name = children.names(ref.name)["spot"]
    await kube.patch("Deployment", ref.namespace, name, {"spec": {"replicas": desired}})
    await kube.patch("RLJob", ref.namespace, ref.name, {"status": {"workers": {"spotDesired": desired}}}, sub="status")
    DESIRED_SPOT.labels(ref.namespace, ref.name).set(desired)
    kopf.info(ref.body(), reason="SpotScaled", message=f"spot workers {before} -> {desired} (capacity on spot nodes)")


async def rescale_all() -> None:
    for ref in list(STATE.jobs.values()):
        try:
            await rescale(ref)
        except Exception:
            ERRORS.labels("rescale").inc()
            ref.spot_replicas = None  # retry on the next event or timer tick
            log.exception("rescaling failed", extra={"job": ref.name, "namespace": ref.namespace})


def _count_spot_nodes() -> None:
    counts: dict[str, int] = {}
    for node in STATE.nodes.values():
        provider = spot.spot_provider(node)
        if provider:
            counts[provider] = counts.get(provider, 0) + 1
    for provider in {p.split("-")[0] for p in spot.SPOT_LABELS}:
        SPOT_NODES.labels(provider).set(counts.get(provider, 0))


async def announce(signal: spot.Preemption) -> None:
    """Publish one notice per job with pods on the node, and post an Event on each RLJob."""
    if (signal.node, signal.reason) in STATE.notified:
        return
    STATE.notified.add((signal.node, signal.reason))
    for (namespace, job), pods in STATE.pods_on(signal.node).items():
        notice = PreemptionNotice(node=signal.node, workers=pods, reason=signal.reason, deadline_s=signal.deadline_s)
        try:
            assert STATE.nats is not None
            await STATE.nats.publish_notice(namespace, job, notice)
        except Exception:
            ERRORS.labels("nats").inc()
            STATE.notified.discard((signal.node, signal.reason))  # try again on the node's next event
            log.exception("publishing a preemption notice failed", extra={"node": signal.node, "job": job})
            continue
        NOTICES.labels(signal.reason).inc()
        log.info(
            "preemption notice sent", extra={"node": signal.node, "job": job, "reason": signal.reason, "workers": pods}
        )
        ref = STATE.jobs.get((namespace, job))
        if ref is not None:
            kopf.info(
                ref.body(),
                reason="Preemption",
                message=f"node {signal.node}: {signal.reason}; draining {', '.join(pods)}",
            )


@kopf.on.event("", "v1", "nodes")
async def node_event(event: dict[str, Any], body: kopf.Body, name: str, **_: Any) -> None:
    deleted = event.get("type") == "DELETED"
    node = dict(body)
    if deleted:
        STATE.nodes.pop(name, None)
    else:
        STATE.nodes[name] = node
    signal = spot.preemption(node, deleted=deleted)
    if signal is None:
        STATE.notified = {n for n in STATE.notified if n[0] != name}  # a recovered node may be preempted again
    else:
        await announce(signal)
    _count_spot_nodes()
    await rescale_all()


@kopf.on.event("", "v1", "pods", labels=JOB_POD_LABELS)
async def pod_event(
    event: dict[str, Any], body: kopf.Body, namespace: str, name: str, labels: kopf.Labels, **_: Any
) -> None:
    problem = model_source.fetch_failure(body) if event.get("type") != "DELETED" else None
    if problem is not None:
        await _fetch_failed(namespace, labels["rlboost.io/job"], name, problem)
    node = body.get("spec", {}).get("nodeName")
    if event.get("type") == "DELETED" or not node:
        STATE.pods.pop((namespace, name), None)
        return
    STATE.pods[(namespace, name)] = (labels["rlboost.io/job"], node)
    signal = spot.preemption(STATE.nodes.get(node, {})) if node in STATE.nodes else None
    if signal is not None:  # a pod landed on a node already going away
        STATE.notified.discard((signal.node, signal.reason))
        await announce(signal)


async def _fetch_failed(namespace: str, job: str, pod: str, problem: model_source.ModelProblem) -> None:
    current = await _kube().get("RLJob", namespace, job)
    if current is None:
        return
    log.warning("model fetch failed", extra={"job": job, "pod": pod, "field": problem.field, "reason": problem.reason})
    await _write_model_failure(current, problem)


@kopf.timer(*RLJOB, interval=STATE.settings.rescale_interval_s, idle=STATE.settings.rescale_interval_s)
async def rescale_timer(namespace: str, name: str, **_: Any) -> None:
    """Safety net: rescale even if a node event was missed."""
    ref = STATE.jobs.get((namespace, name))
    if ref is not None:
        ref.spot_replicas = None
        await rescale(ref)


# --- Status from the job's services ---------------------------------------------------------


async def _ready_workers(namespace: str, job: str) -> dict[str, int]:
    out = {}
    for pool in ("reserved", "spot"):
        dep = await _kube().get("Deployment", namespace, children.names(job)[pool])
        out[pool] = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)
        READY_WORKERS.labels(namespace, job, pool).set(out[pool])
    return out


def _status_lock(namespace: str, job: str) -> asyncio.Lock:
    """One status writer per job at a time: a step report must not overwrite a later 'done'."""
    return STATE.status_locks.setdefault((namespace, job), asyncio.Lock())


async def on_step(namespace: str, job: str, spec: JobSpec, data: bytes) -> None:
    async with _status_lock(namespace, job):
        await _write_step(namespace, job, spec, data)


async def _write_step(namespace: str, job: str, spec: JobSpec, data: bytes) -> None:
    report = StepReport.model_validate_json(data)
    ref = STATE.jobs.get((namespace, job))
    spec = ref.spec if ref is not None else spec  # the latest spec: prices may have changed
    kube = _kube()
    current = await kube.get("RLJob", namespace, job) or {}
    workers = await _ready_workers(namespace, job)
    previous, generation = current.get("status") or {}, _generation(current)
    patch = status.step_status(report, spec, workers, previous, datetime.now(UTC), generation)
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")


async def on_done(namespace: str, job: str, data: bytes) -> None:
    async with _status_lock(namespace, job):
        await _write_done(namespace, job, data)


async def _write_done(namespace: str, job: str, data: bytes) -> None:
    done = JobDone.model_validate_json(data)
    kube = _kube()
    current = await kube.get("RLJob", namespace, job) or {}
    patch = status.done_status(done, current.get("status") or {}, generation=_generation(current))
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    ref = STATE.jobs.get((namespace, job))
    if ref is not None:
        reason = "JobSucceeded" if done.ok else "JobFailed"
        (kopf.info if done.ok else kopf.warn)(ref.body(), reason=reason, message=done.error or f"{done.steps} steps")


@kopf.daemon(*RLJOB, cancellation_timeout=2.0)
async def status_reporter(namespace: str, name: str, spec: kopf.Spec, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """Subscribe to the job's `steps` and `done` subjects until the RLJob goes away."""
    try:
        job_spec = check_job(dict(spec or {}), STATE.settings)
    except SpecProblemError:
        return  # the reconcile handler reported it
    if STATE.nats is None:
        raise kopf.TemporaryError("NATS link not ready", delay=1)
    try:
        subs = [
            await STATE.nats.subscribe(namespace, name, "steps", lambda d: on_step(namespace, name, job_spec, d)),
            await STATE.nats.subscribe(namespace, name, "done", lambda d: on_done(namespace, name, d)),
        ]
    except Exception as err:
        ERRORS.labels("nats").inc()
        raise kopf.TemporaryError(f"cannot subscribe to NATS at {STATE.settings.nats_url}: {err}", delay=5) from err
    try:
        await stopped.wait()
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):  # the connection may already be closed at shutdown
                await sub.unsubscribe()
