"""The operator's own lifetime in kopf: login, startup and cleanup.

The startup handler fills kopf's memo (one fresh memo per run: kopf re-lists every watched object at start) with
the collaborators every handler reaches through it, and starts the two operator-wide loops (spot rescaling, the
identity refresh). kopf copies the memo into each object's own memo shallowly, so each entry is one shared object,
set once here and never replaced: the login handler logs the shared `KubeLogin` in, it does not replace it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from rlboost_operator import spot
from rlboost_operator.config import OperatorSettings, load_settings
from rlboost_operator.credentials import WorkerIdentity
from rlboost_operator.lifecycle import TrainerFailures
from rlboost_operator.metrics import ERRORS, NOTICES, RECONCILIATIONS
from rlboost_operator.preemption import PreemptionNotices
from rlboost_operator.queueing import Queueing
from rlboost_operator.shared import JobLinks, Jobs, KubeLogin, Nodes
from rlboost_operator.sizing import SpotSizer
from rlboost_operator.status_stream import StatusStream
from rlboost_operator.suspension import Suspender


def fill_memo(memo: kopf.Memo, settings: OperatorSettings) -> None:
    """Every collaborator of this run, wired to those it calls; no loop started (start_loops)."""
    memo.settings = settings
    memo.api, memo.jobs, memo.nodes, memo.links = KubeLogin(), Jobs(), Nodes(), JobLinks(settings)
    memo.sizer = SpotSizer(memo.api, settings, memo.jobs, memo.nodes)
    memo.notices = PreemptionNotices(memo.jobs, memo.nodes, memo.links)
    memo.stream = StatusStream(memo.api, memo.jobs, memo.links, memo.sizer)
    memo.identity = WorkerIdentity(memo.api, settings, memo.jobs)
    memo.trainers = TrainerFailures()
    memo.queueing = Queueing(memo.api, settings)
    memo.suspender = Suspender(memo.api, memo.jobs, memo.links, memo.sizer, settings)
    memo.suspender.release = memo.queueing.release


def start_loops(memo: kopf.Memo) -> None:
    """The operator-wide loops: one for all jobs each, not a kopf timer per RLJob (which would add a finalizer)."""
    sizer: SpotSizer = memo.sizer
    identity: WorkerIdentity = memo.identity
    memo.loops = [
        asyncio.create_task(sizer.run(), name="rescale-loop"),
        asyncio.create_task(identity.run(), name="identity-loop"),
    ]


def zero_counters() -> None:
    """Export every counter's known label values at 0 from the start: a dashboard panel or an alert on a counter
    that never fired then shows 0, not "no data" (which reads as a broken scrape)."""
    for reason, _ in spot.PREEMPTION_TAINTS.values():
        NOTICES.labels(reason)
    for reason in ("node-deleted", "node-not-ready", "node-unschedulable"):
        NOTICES.labels(reason)
    for kind in ("reconcile", "rescale", "nats", "identity", "status"):
        ERRORS.labels(kind)
    for result in ("ok", "invalid"):
        RECONCILIATIONS.labels(result)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # No handler needs a finalizer; naming the one older operators added makes kopf remove it from their RLJobs.
    settings.persistence.finalizer = "rlboost.io/operator"
    settings.posting.level = logging.INFO  # scaling and preemption Events are Normal events
    fill_memo(memo, load_settings())
    zero_counters()
    start_loops(memo)


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """Log in like kopf would (service account, else kubeconfig) and keep the result for our client."""
    info = kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)
    if info is not None:
        api: KubeLogin = memo.api
        api.login(info)
    return info


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    sizer: SpotSizer = memo.sizer
    sizer.close()
    for task in memo.loops:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    stream: StatusStream = memo.stream
    stream.close()
    suspender: Suspender = memo.suspender
    suspender.close()
    links: JobLinks = memo.links
    await links.close_all()
    api: KubeLogin = memo.api
    await api.close()
