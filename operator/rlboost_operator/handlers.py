"""kopf handlers of the rlboost operator. Thin: they route watch events to pure builders and the API.

Run: `kopf run -A -m rlboost_operator.handlers` (or `python -m rlboost_operator`).
- RLJob create/update/resume: validate (rlboost_operator.checks), check that the model's claim or token Secret
  exists (model_source.py), write the cluster's service-account keys into the job's credentials for the
  manager's check of worker identities (cluster_keys.py; no children until they are there), build children
  (children.py), adopt them (ownerReferences: deletion is garbage
  collection), create or patch, and subscribe to the job's `steps` and `done` subjects (once per job; the
  subscriptions live in STATE) to write .status.
- Job pods: a `fetch-model` init container that gave up (no such repo, refused credentials; unreachable after
  model_source.FETCH_ATTEMPTS tries) ends the RLJob: Failed with a ModelReady condition naming the spec.model
  field, scaled to zero like any ended job, instead of a silent crash loop.
- The end of a job (`done`, trainer.backoffLimit exceeded by the trainer pods' restarts, a failed fetch): its workloads are
  scaled to zero and stay there on every later reconcile; PVCs, Secret, ConfigMap and status are kept.
- Nodes and spot worker Pods: the spot Deployment is sized by spot_ask.py (to the spot nodes present, or, for
  autoscaled spot pools, to maxReplicas with a shrink and back-off while pods stay unschedulable);
  preemption signals become NATS notices naming the node and the job's pods on it.
- The cluster's service-account keys are re-read every identity_refresh_s (identity_loop) and each running job's
  credentials item rewritten when they changed (a key rotation).
- No RLJob carries a finalizer: nothing here is per-object kopf machinery (daemons, timers, mandatory delete
  handlers would each add one), so an RLJob deletes even when no operator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

from rlboost.auth.credentials import CA_CERT, WORKER_IDENTITY_CLUSTER, added_items, generate_items
from rlboost.auth.nats import client_options
from rlboost.spec import JobSpec, SpotPoolSpec
from rlboost.wire.events import JobDone, PreemptionNotice, StepReport
from rlboost_operator import children, cluster_keys, model_source, spot, spot_ask, spot_busy, status
from rlboost_operator.checks import SpecProblemError, check_job
from rlboost_operator.config import load_settings
from rlboost_operator.kube import Kube, KubeError
from rlboost_operator.metrics import (
    DESIRED_SPOT,
    ERRORS,
    NOTICES,
    READY_WORKERS,
    RECONCILIATIONS,
    SPOT_NODES,
    SPOT_SHRINKS,
    SPOT_TARGET,
    SPOT_UNSCHEDULABLE,
)
from rlboost_operator.notices import NatsLink
from rlboost_operator.state import JobRef, State

log = logging.getLogger(__name__)
RLJOB = ("rlboost.io", "v1alpha1", "rljobs")
MODEL_RECHECK_S = 30  # a missing claim or token Secret is looked for again this often
IDENTITY_READY = "the manager has the cluster's service-account keys to check its workers' identities"
IDENTITY_RETRY_S = 30  # unreadable service-account keys (a new job cannot start without them) are tried again
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
    # No handler needs a finalizer; naming the one older operators added makes kopf remove it from their RLJobs.
    settings.persistence.finalizer = "rlboost.io/operator"
    settings.posting.level = logging.INFO  # scaling and preemption Events are Normal events
    # A fresh view each run: kopf re-lists every watched object at start.
    STATE.settings = load_settings()
    STATE.reset()
    _cancel_rechecks()
    _zero_counters()
    STATE.nats = {}  # a link per job, made with its credentials (_ensure_credentials)
    STATE.background = asyncio.create_task(rescale_loop(), name="rescale-loop")
    STATE.identity_refresh = asyncio.create_task(identity_loop(), name="identity-loop")


def _zero_counters() -> None:
    """Export every counter's known label values at 0 from the start: a dashboard panel or an alert on a counter
    that never fired then shows 0, not "no data" (which reads as a broken scrape)."""
    for reason, _ in spot.PREEMPTION_TAINTS.values():
        NOTICES.labels(reason)
    for reason in ("node-deleted", "node-not-ready", "node-unschedulable"):
        NOTICES.labels(reason)
    for kind in ("reconcile", "rescale", "nats", "identity"):
        ERRORS.labels(kind)
    for result in ("ok", "invalid"):
        RECONCILIATIONS.labels(result)


def _cancel_rechecks() -> None:
    for task in STATE.spot_rechecks.values():
        task.cancel()
    STATE.spot_rechecks.clear()


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    _cancel_rechecks()
    for task in (STATE.background, STATE.identity_refresh):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for namespace, job in list(STATE.followers):
        _stop_following(namespace, job)
    for link in STATE.nats.values():
        await link.close()
    STATE.nats.clear()
    if STATE.kube is not None:
        await STATE.kube.close()


# --- RLJob reconciliation -------------------------------------------------------------------


async def _fail(body: kopf.Body, problem: SpecProblemError) -> None:
    """Phase Failed (unless the job already ended), a condition and a Warning Event naming the field; then stop
    retrying."""
    RECONCILIATIONS.labels("invalid").inc()
    namespace, name = body.metadata.namespace or "default", body.metadata.name or ""
    STATE.jobs.pop((namespace, name), None)
    kube = _kube()
    async with _status_lock(namespace, name):
        previous = ((await kube.get("RLJob", namespace, name)) or {}).get("status") or {}
        patch = status.invalid_status(problem.field, str(problem), previous)
        await kube.patch("RLJob", namespace, name, {"status": patch}, sub="status")
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


async def _ensure_credentials(namespace: str, job: str, body: kopf.Body) -> dict[str, bytes]:
    """The job's credentials and its NATS configuration: made once, never rewritten (running pods hold them; only
    the operator's own item worker-identity.json follows the cluster's keys); and the operator's link to the job's
    NATS, as its user `operator`. Returns the credentials' items."""
    kube, n = _kube(), children.names(job)
    found = await kube.get("Secret", namespace, n["credentials"])
    if found is None:
        items = generate_items(children.tls_hosts(job, namespace))
        await _create_adopted(children.credentials_secret(job, namespace, items), body)
    else:
        items = children.secret_items(found)
        if added := added_items(items):  # made before these items existed: add them, keep the rest
            patch = children.credentials_secret(job, namespace, added)
            await kube.patch("Secret", namespace, n["credentials"], {"data": patch["data"]})
            items |= added
    if await kube.get("Secret", namespace, n["nats_config"]) is None:
        await _create_adopted(children.nats_config_secret(job, namespace, items), body)
    if (namespace, job) not in STATE.nats:
        STATE.nats[(namespace, job)] = _nats_link(namespace, job, items)
    return items


async def _cluster_keys(fresh: bool = False) -> cluster_keys.ClusterKeys:
    """The API server's service-account issuer and signing keys (cluster_keys.py: why every service account,
    the operator's included, may read them): those read within identity_refresh_s unless `fresh` (the refresh
    loop's read, which is what brings a key rotation)."""
    asked = time.monotonic()
    async with STATE.cluster_keys_lock:  # reconciles that start together share the read the first one makes
        cached = STATE.cluster_keys
        read_since = cached is not None and cached[0] >= asked  # by a reconcile that held the lock before us
        recent = cached is not None and asked - cached[0] < STATE.settings.identity_refresh_s
        if cached is not None and (read_since or (recent and not fresh)):
            return cached[1]
        keys = await _read_cluster_keys()
        STATE.cluster_keys = (time.monotonic(), keys)
        return keys


async def _read_cluster_keys() -> cluster_keys.ClusterKeys:
    kube, answers = _kube(), []
    for path in (cluster_keys.ISSUER_PATH, cluster_keys.JWKS_PATH):
        try:
            answers.append(await kube.get_path(path))
        except TimeoutError as err:
            raise cluster_keys.DiscoveryError(path, f"no answer within {kube.request_timeout_s:g} s") from err
        except (KubeError, aiohttp.ClientError, ValueError) as err:
            raise cluster_keys.DiscoveryError(path, str(err)) from err
    return cluster_keys.parse_discovery(*answers)


async def _write_identity_item(namespace: str, job: str, item: bytes, present: bytes | None) -> bool:
    """Write the job's worker-identity.json when it differs from what its Secret holds; True if written."""
    if item == present:
        return False
    patch = children.credentials_secret(job, namespace, {WORKER_IDENTITY_CLUSTER: item})
    await _kube().patch("Secret", namespace, children.names(job)["credentials"], {"data": patch["data"]})
    log.info("wrote the cluster's service-account keys", extra={"job": job, "namespace": namespace})
    return True


async def _ensure_worker_identity(body: kopf.Body, items: dict[str, bytes], ended: bool) -> bool:
    """The cluster's keys in the job's credentials (worker-identity.json), up to date; True when it is there. A
    job without it gets no children (its manager would refuse every worker): the failure goes into the status
    (WorkerIdentityReady False, naming the endpoint and the fix) and the reconcile is retried. A job that has it
    keeps running on it through a failed re-read; an ended job needs none."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    present = items.get(WORKER_IDENTITY_CLUSTER)
    try:
        keys = await _cluster_keys()
    except cluster_keys.DiscoveryError as err:
        if present is not None or ended:
            log.warning("cannot re-read the cluster's service-account keys", extra={"job": job, "error": str(err)})
            return present is not None
        await _write_identity_failure(body, str(err))
        raise kopf.TemporaryError(str(err), delay=IDENTITY_RETRY_S) from None
    item = cluster_keys.identity_item(job, namespace, keys)
    if await _write_identity_item(namespace, job, item, present):
        items[WORKER_IDENTITY_CLUSTER] = item
    return True


async def _write_identity_failure(body: kopf.Body, message: str) -> None:
    """WorkerIdentityReady False and a Warning Event, unless the status says so already. Called with the job's
    status lock held."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    current = await _kube().get("RLJob", namespace, job) or {}
    previous = current.get("status") or {}
    if any(
        c.get("type") == cluster_keys.CONDITION and c.get("message") == message
        for c in previous.get("conditions") or []
    ):
        return
    patch = status.worker_identity_status(previous, False, "IssuerDiscoveryFailed", message, _generation(current))
    await _kube().patch("RLJob", namespace, job, {"status": patch}, sub="status")
    kopf.warn(body, reason="IssuerDiscoveryFailed", message=message)


async def _create_adopted(obj: dict[str, Any], body: kopf.Body) -> None:
    kopf.adopt(obj, owner=body)
    await _kube().create(obj)


def _nats_link(namespace: str, job: str, credentials: dict[str, bytes]) -> NatsLink:
    """A link to the job's NATS (its Service, or the operator's nats_url template), TLS checked against the
    Service's name."""
    template = STATE.settings.nats_url
    url = template.format(job=job, namespace=namespace) if template else children.nats_url(job, namespace)
    password, ca = children.operator_nats_password(credentials), credentials.get(CA_CERT)
    options = client_options("operator", password, ca, tls_hostname=children.nats_host(job, namespace))
    return NatsLink(url, options=options)


def _autoscaled(pool: SpotPoolSpec) -> bool:
    """Whether the pool's spot nodes come from an autoscaler: the job's sizing, else the operator's."""
    return (pool.sizing if pool.sizing != "default" else STATE.settings.spot_sizing) == "autoscaler"


def _ask_settings() -> spot_ask.AskSettings:
    s = STATE.settings
    return spot_ask.AskSettings(
        s.spot_pending_timeout_s, s.spot_retry_backoff_s, s.spot_retry_backoff_max_s, s.spot_probe_workers
    )


def _spot_decision(
    namespace: str, job: str, spec: JobSpec, saved: dict[str, Any] | None = None, saved_target: int | None = None
) -> spot_ask.Decision:
    """The spot ask now: the capacity present (at most the busy target, for busy sizing), or the job's autoscaler
    state machine fed its pods. `saved` / `saved_target`: the state machine / busy target as the RLJob's status
    kept them (status.workers.spotAsk / spotTarget), taken up when this operator has none (it restarted, or a new
    leader took over), so a back-off, pending bound or busy target carries on."""
    pool, pods = spec.rollout.spot, STATE.spot_pods_of(namespace, job)
    SPOT_UNSCHEDULABLE.labels(namespace, job).set(sum(1 for p in pods if p.unschedulable_since is not None))
    if not _autoscaled(pool):
        STATE.spot_asks.pop((namespace, job), None)
        _recheck_later(namespace, job, None)
        if spot_busy.busy_sized(spec):
            return spot_busy.busy_decision(STATE.nodes.values(), spec, _busy_target(namespace, job, spec, saved_target))
        STATE.spot_targets.pop((namespace, job), None)
        return spot_ask.capacity_decision(STATE.nodes.values(), pool)
    ask = STATE.spot_asks.get((namespace, job))
    if ask is None:
        ask = STATE.spot_asks[(namespace, job)] = spot_ask.SpotAsk.from_status(_ask_settings(), saved)
    doomed = {name for name, node in STATE.nodes.items() if spot.preemption(node) is not None}
    decision = ask.decide(time.time(), pool, pods, doomed)
    if decision.shrunk:
        SPOT_SHRINKS.labels(namespace, job).inc()
    _recheck_later(namespace, job, decision.recheck_s)
    return decision


def _busy_target(namespace: str, job: str, spec: JobSpec, saved: int | None) -> int:
    """Busy sizing's target for the job: this operator's, else the status's, else a fresh one (maxReplicas)."""
    target = STATE.spot_targets.get((namespace, job))
    if target is None:
        target = STATE.spot_targets[(namespace, job)] = spot_busy.scaler(spec, saved).target
    SPOT_TARGET.labels(namespace, job).set(target)
    return target


def _recheck_later(namespace: str, job: str, delay_s: float | None) -> None:
    """Decide the job's spot ask again after `delay_s` (a pending bound or a retry falls due with no event)."""
    previous = STATE.spot_rechecks.pop((namespace, job), None)
    if previous is not None:
        previous.cancel()  # still sleeping: a recheck that woke up has left the dict
    if delay_s is not None:
        STATE.spot_rechecks[(namespace, job)] = asyncio.create_task(_recheck(namespace, job, delay_s))


async def _recheck(namespace: str, job: str, delay_s: float) -> None:
    key = (namespace, job)
    await asyncio.sleep(delay_s + 0.05)  # just past the bound, not just before it
    if STATE.spot_rechecks.get(key) is asyncio.current_task():
        del STATE.spot_rechecks[key]  # awake: a newer decision must not cancel it halfway through its writes
    ref = STATE.jobs.get(key)
    if ref is not None:
        await rescale_job(ref)


def _spot_split(namespace: str, job: str, spec: JobSpec, decision: spot_ask.Decision) -> dict[str, int]:
    """The spot ask per variant of the job's spot pool ({} without variants): spot.variant_split, bounded by the
    variants' nodes, or for an autoscaled pool by the pods each has placed."""
    pool, placed = spec.rollout.spot, None
    if _autoscaled(pool):
        doomed = {name for name, node in STATE.nodes.items() if spot.preemption(node) is not None}
        placed = spot_ask.placed_per_variant(STATE.spot_pods_of(namespace, job), doomed)
    return spot.variant_split(STATE.nodes.values(), pool, decision.replicas, placed)


def _spot_status(namespace: str, job: str, decision: spot_ask.Decision, split: dict[str, int]) -> dict[str, Any]:
    """status.workers' spot fields: the ask, why, the autoscaler state machine (null in capacity mode) and the
    ask per variant (null without variants)."""
    ask = STATE.spot_asks.get((namespace, job))
    return {
        "spotDesired": decision.replicas,
        "spotReason": decision.reason,
        "spotMessage": decision.message,
        "spotAsk": ask.to_status() if ask is not None else None,
        "spotTarget": STATE.spot_targets.get((namespace, job)),
        "spotSplit": status.variant_list(split, "replicas") if split else None,
    }


def _status_variants(workers_status: dict[str, Any] | None) -> list[str]:
    """The spot variants status.workers.spotSplit names (what the operator last asked for)."""
    split = (workers_status or {}).get("spotSplit") or []
    return [item["name"] for item in split if isinstance(item, dict) and isinstance(item.get("name"), str)]


def _rljob_variants(rljob: dict[str, Any]) -> list[str]:
    """Every spot variant an RLJob (as read) may have a Deployment of: its spec's and its status's."""
    spot_spec = ((rljob.get("spec") or {}).get("rollout") or {}).get("spot") or {}
    declared = [v["name"] for v in spot_spec.get("variants") or [] if isinstance(v, dict) and "name" in v]
    return [*declared, *_status_variants((rljob.get("status") or {}).get("workers"))]


async def _retire_spot(namespace: str, job: str, spec: JobSpec, previous_variants: list[str]) -> None:
    """Scale to zero the spot Deployments an edit of rollout.spot.variants left behind: variants gone from the
    spec, the pool's single Deployment once there are variants (it may not exist: fine)."""
    current = set(children.spot_deployments(job, spec))
    names = [children.spot_variant_name(job, v) for v in previous_variants]
    if spec.rollout.spot.variants:
        names.append(children.names(job)["spot"])
    for name in dict.fromkeys(n for n in names if n not in current):
        await _patch_if_present("Deployment", namespace, name, {"spec": {"replicas": 0}})


async def _patch_if_present(kind: str, namespace: str, name: str, body: dict[str, Any]) -> None:
    try:
        await _kube().patch(kind, namespace, name, body)
    except KubeError as err:
        if err.status != 404:
            raise


def _announce_spot(ref: JobRef, before: int | None, decision: spot_ask.Decision) -> None:
    """An Event saying what the spot ask became and why."""
    change = f"spot workers {before} -> {decision.replicas}: " if before not in (None, decision.replicas) else ""
    post = kopf.warn if decision.shrunk else kopf.info
    post(ref.body(), reason=decision.reason, message=change + decision.message)


async def reconcile(body: kopf.Body, spec_data: Any) -> None:
    """Validate, then create or patch every child of the RLJob (at zero replicas once the job ended), and follow
    a running job's status subjects."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    try:
        spec = check_job(dict(spec_data or {}), STATE.settings)
    except SpecProblemError as problem:
        await _fail(body, problem)
    missing = await model_source.missing_model_objects(_kube().get, namespace, spec.model)
    if missing is not None:
        await _model_unavailable(body, missing)
    async with _status_lock(namespace, job):  # judged on the status as it is now, not as the event saw it
        ended = await _apply_children(body, spec)
    if not ended:
        _follow_status_soon(namespace, job, spec, status.parse_iso(body.metadata.get("creationTimestamp")))
    RECONCILIATIONS.labels("ok").inc()


async def _apply_children(body: kopf.Body, spec: JobSpec) -> bool:
    """Create or patch the children and write the status; True when the job already ended (kept at zero)."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    kube = _kube()
    previous = ((await kube.get("RLJob", namespace, job)) or {}).get("status") or {}
    ended = status.finished(previous)
    saved = previous.get("workers") or {}
    decision = (
        None if ended else _spot_decision(namespace, job, spec, saved.get("spotAsk"), spot_busy.saved_target(saved))
    )
    replicas = decision.replicas if decision else 0
    split = _spot_split(namespace, job, spec, decision) if decision else {}
    items = await _ensure_credentials(namespace, job, body)
    identity = await _ensure_worker_identity(body, items, ended)
    built = children.build_children(job, namespace, spec, STATE.settings, replicas, finished=ended, spot_split=split)
    for child in built:
        if children.adopted(child):
            kopf.adopt(child, owner=body)
        await kube.apply(child)
    await _retire_spot(namespace, job, spec, _status_variants(saved))
    if decision is None:
        _drop_job(namespace, job)
    else:
        _remember_job(body, spec, decision, split)
    # the model's claim or Secret exists now: a failed pre-check of it no longer holds
    previous = {**previous, "conditions": model_source.without_precheck_failure(previous.get("conditions"))}
    patch = status.reconcile_status(previous, replicas, _generation(body))
    if decision is not None:
        patch["workers"].update(_spot_status(namespace, job, decision, split))
    if identity:
        ready = status.condition(cluster_keys.CONDITION, True, "KeysWritten", IDENTITY_READY, None, _generation(body))
        patch["conditions"] = status.set_condition(patch["conditions"], ready)
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    return ended


def _remember_job(body: kopf.Body, spec: JobSpec, decision: spot_ask.Decision, split: dict[str, int]) -> None:
    """Keep a running job for rescaling; say so when its spot ask is new or changed."""
    namespace, job = body.metadata.namespace or "default", body.metadata.name or ""
    ref = JobRef(namespace, job, body.metadata.uid or "", spec, decision.replicas, decision.reason)
    workers_status = _spot_status(namespace, job, decision, split)
    ref.spot_ask, ref.spot_target, ref.spot_split = workers_status["spotAsk"], workers_status["spotTarget"], split
    known = STATE.jobs.get((namespace, job))
    STATE.jobs[(namespace, job)] = ref
    if known is None or (known.spot_replicas, known.spot_reason) != (decision.replicas, decision.reason):
        _announce_spot(ref, known.spot_replicas if known else None, decision)
    DESIRED_SPOT.labels(namespace, job).set(decision.replicas)


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


def _drop_job(namespace: str, name: str) -> None:
    """Stop scaling a job (it ended or went away) and drop its gauges."""
    STATE.spot_asks.pop((namespace, name), None)
    STATE.spot_targets.pop((namespace, name), None)
    _recheck_later(namespace, name, None)
    if STATE.jobs.pop((namespace, name), None) is not None:
        DESIRED_SPOT.remove(namespace, name)
    for series in (SPOT_SHRINKS, SPOT_UNSCHEDULABLE, SPOT_TARGET):
        with contextlib.suppress(KeyError):
            series.remove(namespace, name)
    for pool in ("reserved", "spot"):
        with contextlib.suppress(KeyError):
            READY_WORKERS.remove(namespace, name, pool)


@kopf.on.event(*RLJOB)
async def rljob_event(event: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """A deleted RLJob: children go by garbage collection (ownerReferences); forget the job here. A watch event,
    not a delete handler: kopf calls those only for objects it holds with a finalizer, and RLJobs carry none."""
    if event.get("type") != "DELETED":
        return
    _drop_job(namespace, name)
    for sub in STATE.subscriptions.pop((namespace, name), []):
        with contextlib.suppress(Exception):  # the connection may be gone
            await sub.unsubscribe()
    _stop_following(namespace, name)
    link = STATE.nats.pop((namespace, name), None)
    if link is not None:
        with contextlib.suppress(Exception):
            await link.close()
    STATE.status_locks.pop((namespace, name), None)
    STATE.trainer_failures = {k: v for k, v in STATE.trainer_failures.items() if (k[0], v[0]) != (namespace, name)}


# --- Spot pools and preemption --------------------------------------------------------------


async def rescale(ref: JobRef, force: bool = False) -> None:
    """Scale the job's spot Deployment to the spot ask (spot_ask.py); an Event and the status say why.

    `force` writes the ask even if it did not change (the timer's safety net)."""
    decision = _spot_decision(ref.namespace, ref.name, ref.spec)
    split = _spot_split(ref.namespace, ref.name, ref.spec, decision)
    before, reason = ref.spot_replicas, ref.spot_reason
    workers_status = _spot_status(ref.namespace, ref.name, decision, split)
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
    kube = _kube()
    if STATE.jobs.get((ref.namespace, ref.name)) is not ref:
        return  # the job ended (scaled to zero) or was reconciled anew meanwhile: its own write wins
    for name, replicas in _spot_replicas(ref.name, ref.spec, decision.replicas, split):
        await kube.patch("Deployment", ref.namespace, name, {"spec": {"replicas": replicas}})
    await kube.patch("RLJob", ref.namespace, ref.name, {"status": {"workers": workers_status}}, sub="status")
    DESIRED_SPOT.labels(ref.namespace, ref.name).set(decision.replicas)
    if (before, reason) != (decision.replicas, decision.reason):
        _announce_spot(ref, before, decision)


def _spot_replicas(job: str, spec: JobSpec, total: int, split: dict[str, int]) -> list[tuple[str, int]]:
    """(Deployment, replicas) of each of the job's spot Deployments for the ask `total` split as `split`."""
    if not spec.rollout.spot.variants:
        return [(children.names(job)["spot"], total)]
    return [(children.spot_variant_name(job, v.name), split.get(v.name, 0)) for v in spec.rollout.spot.variants]


async def rescale_job(ref: JobRef, force: bool = False) -> None:
    """rescale(), with a failure counted and logged; the next event or timer tick tries again."""
    try:
        await rescale(ref, force)
    except Exception:
        ERRORS.labels("rescale").inc()
        ref.spot_replicas = None
        log.exception("rescaling failed", extra={"job": ref.name, "namespace": ref.namespace})


async def rescale_all() -> None:
    for ref in list(STATE.jobs.values()):
        await rescale_job(ref)


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
            link = STATE.nats.get((namespace, job))
            if link is None:
                raise RuntimeError("no link to the job's NATS yet: the RLJob was not reconciled")
            await link.publish_notice(namespace, job, notice)
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


def _track_spot_pod(deleted: bool, pod: dict[str, Any], namespace: str, name: str, job: str) -> bool:
    """Keep the job's spot worker pods (node, or unschedulable since when); True if this one changed."""
    key = (namespace, name)
    known = STATE.spot_pods.get(key)
    if deleted or not spot_ask.counts_as_spot_worker(pod):
        return STATE.spot_pods.pop(key, None) is not None
    first_seen = known[1].unschedulable_since if known and known[1].unschedulable_since is not None else time.time()
    current = (job, spot_ask.spot_pod(pod, first_seen))
    STATE.spot_pods[key] = current
    return current != known


@kopf.on.event("", "v1", "pods", labels=JOB_POD_LABELS)
async def pod_event(
    event: dict[str, Any], body: kopf.Body, namespace: str, name: str, labels: kopf.Labels, **_: Any
) -> None:
    problem = model_source.fetch_failure(body) if event.get("type") != "DELETED" else None
    if problem is not None:
        await _fetch_failed(namespace, labels["rlboost.io/job"], name, problem)
    await watch_trainer(event, body, namespace, name, labels)
    job = labels["rlboost.io/job"]
    if _track_spot_pod(event.get("type") == "DELETED", dict(body), namespace, name, job):
        ref = STATE.jobs.get((namespace, job))
        if ref is not None:
            await rescale_job(ref)
    node = body.get("spec", {}).get("nodeName")
    if event.get("type") == "DELETED" or not node:
        STATE.pods.pop((namespace, name), None)
        return
    STATE.pods[(namespace, name)] = (labels["rlboost.io/job"], node)
    signal = spot.preemption(STATE.nodes.get(node, {})) if node in STATE.nodes else None
    if signal is not None:  # a pod landed on a node already going away
        STATE.notified.discard((signal.node, signal.reason))
        await announce(signal)


async def rescale_loop() -> None:
    """Safety net: rescale every job even if a node event was missed. One loop for all jobs, started with the
    operator: a per-RLJob kopf timer would put a finalizer on every RLJob."""
    while True:
        await asyncio.sleep(STATE.settings.rescale_interval_s)
        for ref in list(STATE.jobs.values()):
            await rescale_job(ref, force=True)  # written even if unchanged: the Deployment may have been edited


async def identity_loop() -> None:
    """Re-read the cluster's service-account keys every identity_refresh_s and rewrite each running job's
    worker-identity.json that they changed (a key rotation; the manager re-reads the file). One loop for all
    jobs, as rescale_loop, so no RLJob gets a finalizer."""
    while True:
        await asyncio.sleep(STATE.settings.identity_refresh_s)
        try:
            await refresh_worker_identities()
        except Exception:
            ERRORS.labels("identity").inc()
            log.exception("refreshing the cluster's service-account keys failed; trying again next period")


async def refresh_worker_identities() -> None:
    """Each running job's worker-identity.json, rewritten where the cluster's keys changed."""
    if not STATE.jobs:
        return
    keys = await _cluster_keys(fresh=True)
    for namespace, job in list(STATE.jobs):
        secret = await _kube().get("Secret", namespace, children.names(job)["credentials"])
        if secret is not None:
            present = children.secret_items(secret).get(WORKER_IDENTITY_CLUSTER)
            await _write_identity_item(namespace, job, cluster_keys.identity_item(job, namespace, keys), present)


async def _fetch_failed(namespace: str, job: str, pod: str, problem: model_source.ModelProblem) -> None:
    """A job pod's fetcher gave up: the job ends Failed (ModelReady=False naming the spec.model field) and is
    scaled to zero, so no pod crash-loops on a source that cannot work."""
    async with _status_lock(namespace, job):
        current = await _kube().get("RLJob", namespace, job)
        if current is None or status.finished(current.get("status") or {}):
            return  # gone, or ended already (every failing pod of the job reports it)
        log.warning(
            "model fetch failed", extra={"job": job, "pod": pod, "field": problem.field, "reason": problem.reason}
        )
        previous, generation = current.get("status") or {}, _generation(current)
        outcome = status.model_failed_status(
            problem.field, problem.reason, problem.message, previous, generation=generation, ended=True
        )
        message = f"spec.model.{problem.field}: {problem.message}"
        await _end(current, outcome, "ModelUnavailable", (problem.reason, message), ok=False)


# --- Status from the job's services ---------------------------------------------------------


async def _ready_replicas(namespace: str, name: str) -> int:
    dep = await _kube().get("Deployment", namespace, name)
    return int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)


async def _ready_workers(namespace: str, job: str, spec: JobSpec) -> tuple[dict[str, int], dict[str, int] | None]:
    """Ready workers per pool, and per spot variant (None without variants)."""
    variants = None
    if spec.rollout.spot.variants:
        names = {v.name: children.spot_variant_name(job, v.name) for v in spec.rollout.spot.variants}
        variants = {v: await _ready_replicas(namespace, name) for v, name in names.items()}
    out = {"reserved": await _ready_replicas(namespace, children.names(job)["reserved"])}
    out["spot"] = (
        sum(variants.values())
        if variants is not None
        else await _ready_replicas(namespace, children.names(job)["spot"])
    )
    for pool, n in out.items():
        READY_WORKERS.labels(namespace, job, pool).set(n)
    return out, variants


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
    previous, generation = current.get("status") or {}, _generation(current)
    if status.finished(previous):  # an ended job's status stays as it ended (no workers, no cost)
        return
    workers, variants = await _ready_workers(namespace, job, spec)
    patch = status.step_status(report, spec, workers, previous, datetime.now(UTC), generation, variants)
    await kube.patch("RLJob", namespace, job, {"status": patch}, sub="status")
    if spot_busy.busy_sized(spec):
        await _follow_busy(namespace, job, spec, report, previous.get("workers"))


async def _follow_busy(
    namespace: str, job: str, spec: JobSpec, report: StepReport, workers_status: dict[str, Any] | None
) -> None:
    """Busy sizing: the step report moves the job's target; the spot Deployment follows it (rescale)."""
    target = _busy_target(namespace, job, spec, spot_busy.saved_target(workers_status))
    STATE.spot_targets[(namespace, job)] = new = spot_busy.next_target(spec, target, report)
    SPOT_TARGET.labels(namespace, job).set(new)
    ref = STATE.jobs.get((namespace, job))
    if ref is not None:
        await rescale_job(ref)


async def on_done(namespace: str, job: str, data: bytes) -> None:
    async with _status_lock(namespace, job):
        await _write_done(namespace, job, data)


async def _write_done(namespace: str, job: str, data: bytes) -> None:
    done = JobDone.model_validate_json(data)
    current = await _kube().get("RLJob", namespace, job)
    if current is None:
        return
    previous = current.get("status") or {}
    if status.finished(previous):  # a repeated `done` (a restarted trainer re-publishes it): keep the first end
        await _scale_to_zero(namespace, job, _rljob_variants(current))
        return
    outcome = status.done_status(done, previous, generation=_generation(current))
    event = ("JobSucceeded", f"{done.steps} steps") if done.ok else ("JobFailed", done.error or "trainer failed")
    await _end(current, outcome, "JobFinished", event, ok=done.ok)


async def _scale_to_zero(namespace: str, job: str, variants: list[str]) -> None:
    """Every workload of the job (`variants`: its spot variants') at zero replicas (a child already gone is fine)."""
    for kind, name in children.workloads(job, variants):
        await _patch_if_present(kind, namespace, name, {"spec": {"replicas": 0}})


async def _end(current: dict[str, Any], outcome: dict[str, Any], reason: str, event: tuple[str, str], ok: bool) -> None:
    """A job ended: scale its workloads to zero, then write how it ended and that it stopped, and post Events.
    Called with the job's status lock held. Scaling first: if it fails, the status does not claim it happened
    (and the trainer, restarted by its StatefulSet, re-publishes `done`, which tries again)."""
    meta = current.get("metadata") or {}
    namespace, job = meta.get("namespace") or "default", meta.get("name") or ""
    _drop_job(namespace, job)  # no more spot rescaling
    await _scale_to_zero(namespace, job, _rljob_variants(current))
    previous, generation = current.get("status") or {}, _generation(current)
    patch = {**outcome, **status.stopped_status({**previous, **outcome}, reason, generation=generation)}
    await _kube().patch("RLJob", namespace, job, {"status": patch}, sub="status")
    target = {"apiVersion": "rlboost.io/v1alpha1", "kind": "RLJob", "metadata": meta}
    (kopf.info if ok else kopf.warn)(target, reason=event[0], message=event[1])
    kopf.info(target, reason="ScaledToZero", message=patch["conditions"][-1]["message"])


async def watch_trainer(event: dict[str, Any], pod: kopf.Body, namespace: str, name: str, labels: kopf.Labels) -> None:
    """Count a trainer pod's failures; past the job's trainer.backoffLimit the job is Failed and scaled to zero."""
    if labels.get("app.kubernetes.io/component") != "trainer":
        return
    if event.get("type") == "DELETED":
        STATE.trainer_failures.pop((namespace, name), None)
        return
    job = labels["rlboost.io/job"]
    STATE.trainer_failures[(namespace, name)] = (job, status.trainer_failures(pod))
    ref = STATE.jobs.get((namespace, job))
    failures = STATE.most_trainer_failures(namespace, job)
    if ref is None or not status.backoff_exceeded(failures, ref.spec.trainer.backoff_limit):
        return
    async with _status_lock(namespace, job):
        current = await _kube().get("RLJob", namespace, job)
        if current is None or status.finished(current.get("status") or {}):
            return
        limit = ref.spec.trainer.backoff_limit
        outcome = status.backoff_status(failures, limit, current.get("status") or {}, generation=_generation(current))
        message = outcome["conditions"][-1]["message"]
        await _end(current, outcome, "BackoffLimitExceeded", ("BackoffLimitExceeded", message), ok=False)


def _follow_status_soon(namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
    """Follow the job's status subjects from a task that retries until subscribed: the job's own NATS starts with
    the job (a new pod, maybe an image pull), and the reconcile must not wait for it."""
    key = (namespace, job)
    running = STATE.followers.get(key)
    if key in STATE.subscriptions or (running is not None and not running.done()):
        return
    STATE.followers[key] = asyncio.create_task(_follow_until_subscribed(namespace, job, spec, since))


async def _follow_until_subscribed(namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
    pause = 1.0
    while (namespace, job) not in STATE.subscriptions:
        try:
            await _follow_status(namespace, job, spec, since)
        except kopf.TemporaryError as err:
            extra = {"job": job, "namespace": namespace, "error": str(err), "in_s": pause}
            log.warning("cannot follow the job's status yet; trying again", extra=extra)
            await asyncio.sleep(pause)
            pause = min(2 * pause, 10.0)


def _stop_following(namespace: str, job: str) -> None:
    task = STATE.followers.pop((namespace, job), None)
    if task is not None:
        task.cancel()


async def _follow_status(namespace: str, job: str, spec: JobSpec, since: datetime | None) -> None:
    """Subscribe to the job's `steps` and `done` subjects, once per job (kept in STATE until the RLJob goes);
    `since`: the RLJob's creation (older kept messages are an earlier RLJob's of the same name)."""
    if (namespace, job) in STATE.subscriptions:
        return
    link = STATE.nats.get((namespace, job))
    if link is None:
        raise kopf.TemporaryError("no link to the job's NATS yet", delay=1)
    subs: list[Any] = []
    try:
        subs.append(await link.subscribe(namespace, job, "steps", lambda d: on_step(namespace, job, spec, d), since))
        subs.append(await link.subscribe(namespace, job, "done", lambda d: on_done(namespace, job, d), since))
    except Exception as err:
        ERRORS.labels("nats").inc()
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        raise kopf.TemporaryError(f"cannot subscribe to the job's NATS at {link.url}: {err}", delay=5) from err
    STATE.subscriptions[(namespace, job)] = subs
