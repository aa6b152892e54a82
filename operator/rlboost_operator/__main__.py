"""Run the rlboost operator: `python -m rlboost_operator [--metrics-port 9090] [--liveness-port 8080]`.

Watches RLJobs cluster-wide (or in --namespace), serves Prometheus /metrics, and kopf's liveness
endpoint at /healthz. Several replicas are safe together: by default each one first waits to hold
the leader Lease (leader.py; --lease-name in --lease-namespace), then runs kopf while it renews the
Lease in the background. A replica that loses the Lease stops kopf and exits non-zero, so its pod
restarts as a standby; one that stops cleanly (SIGTERM) releases it so a standby takes over at once.
--standalone runs kopf at once with no election (a single replica, tests).
Settings (images, NATS, limits) come from RLBOOST_OPERATOR_* variables (see config.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rlboost.options.base import env_default
from rlboost.wire.service_routes import HEALTHZ

if TYPE_CHECKING:  # imported when needed: `--help` should not load kopf
    import kopf

    from rlboost_operator.leader import ElectionConfig, LeaderElector

log = logging.getLogger("rlboost_operator")
STOP_GRACE_S = 5.0  # how long a replica that lost the Lease waits for kopf to wind down before it exits
# The election's timing flags (client-go's defaults): type, default, help.
ELECTION_TIMING: dict[str, tuple[type[int] | type[float], float, str]] = {
    "lease-duration": (int, 15, "seconds a standby waits on an unrenewed Lease before taking it"),
    "renew-deadline": (float, 10.0, "seconds the leader keeps retrying a failed renewal before it steps down"),
    "retry-period": (float, 2.0, "seconds between acquisition attempts and renewals"),
}
ELECTION_FLAGS = {
    "lease_name": "--lease-name",
    "lease_namespace": "--lease-namespace",
    "identity": "POD_NAME",
    "lease_duration_s": "--lease-duration",
    "renew_deadline_s": "--renew-deadline",
    "retry_period_s": "--retry-period",
}


def _env_flag(flag: str, default: bool) -> bool:
    return str(env_default(flag, default)).strip().lower() in ("1", "true", "yes", "on")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rlboost_operator", description="The rlboost Kubernetes operator (kopf)."
    )
    p.add_argument(
        "--metrics-port", type=int, default=int(env_default("metrics-port", 9090)), help="Prometheus /metrics port"
    )
    p.add_argument(
        "--liveness-port", type=int, default=int(env_default("liveness-port", 8080)), help="kopf /healthz port"
    )
    p.add_argument(
        "--namespace", action="append", default=[], help="watch only these namespaces (repeatable); default: all"
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("leader-elect", True),
        help="act only while holding the leader Lease (default; safe with several replicas)",
    )
    p.add_argument("--standalone", action="store_true", help="no leader election: a single replica (tests, local)")
    p.add_argument("--lease-name", default=str(env_default("lease-name", "rlboost-operator")), help="the Lease's name")
    p.add_argument(
        "--lease-namespace",
        default=str(env_default("lease-namespace", "")),
        help="the Lease's namespace; default: POD_NAMESPACE, else the credentials' namespace, else 'default'",
    )
    for flag, (kind, default, text) in ELECTION_TIMING.items():
        p.add_argument(f"--{flag}", type=kind, default=kind(env_default(flag, default)), help=text)
    p.add_argument("--log-level", default=str(env_default("log-level", "INFO")), help="DEBUG, INFO, WARNING, ERROR")
    args = p.parse_args(argv)
    if args.standalone:
        args.leader_elect = False
    return args


def election_config(args: argparse.Namespace, default_namespace: str | None) -> ElectionConfig:
    """The election settings from the flags; a bad one exits naming the flag."""
    from pydantic import ValidationError

    from rlboost_operator.leader import ElectionConfig, new_identity

    namespace = args.lease_namespace or os.environ.get("POD_NAMESPACE") or default_namespace or "default"
    try:
        return ElectionConfig(
            lease_name=args.lease_name,
            lease_namespace=namespace,
            identity=new_identity(),
            lease_duration_s=args.lease_duration,
            renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry_period,
        )
    except ValidationError as err:
        where = [ELECTION_FLAGS.get(str(e["loc"][0]) if e["loc"] else "", "leader election") for e in err.errors()]
        bad = "; ".join(f"{flag}: {e['msg']}" for flag, e in zip(where, err.errors(), strict=True))
        raise SystemExit(f"rlboost-operator: invalid setting: {bad}") from None


async def run_kopf(args: argparse.Namespace, settings: kopf.OperatorSettings | None = None) -> None:
    """kopf with every handler of rlboost_operator.handlers; peering off (one replica acts, by the Lease)."""
    import kopf

    import rlboost_operator.handlers  # noqa: F401 (imports the handler modules, which registers them)
    from rlboost_operator.config import load_settings

    load_settings()  # a bad setting exits here, naming the variable, before kopf starts (startup reads them again)

    await kopf.operator(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=True,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}{HEALTHZ}",
        settings=settings,
    )


@contextlib.asynccontextmanager
async def standby_liveness(port: int) -> AsyncIterator[None]:
    """Answer the liveness probe while standing by; kopf serves it on the same port once leading."""
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="standing by\n")

    app = web.Application()
    app.router.add_get(HEALTHZ, healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    try:
        yield
    finally:
        await runner.cleanup()


async def run_elected(args: argparse.Namespace) -> int:
    """Wait for the Lease, then run kopf while renewing it; the exit code says how leadership ended."""
    from rlboost_operator.kube import Kube, discover_connection
    from rlboost_operator.leader import LeaderElector

    info = discover_connection()
    if info is None:
        raise SystemExit("rlboost-operator: no Kubernetes credentials: no service account and no KUBECONFIG")
    kube = Kube(info)
    try:
        elector = LeaderElector(kube, election_config(args, info.default_namespace))
        async with standby_liveness(args.liveness_port):
            await elector.acquire()
        return await lead(args, elector)
    finally:
        await kube.close()


async def lead(args: argparse.Namespace, elector: LeaderElector) -> int:
    """Run kopf while keep() renews the Lease; 0 after a clean stop, 1 when leadership was lost."""
    import kopf

    settings = kopf.OperatorSettings()
    operator = asyncio.create_task(run_kopf(args, settings), name="kopf")
    keeper = asyncio.create_task(elector.keep(), name="lease-renewal")
    await asyncio.wait({operator, keeper}, return_when=asyncio.FIRST_COMPLETED)
    if keeper.done():
        # Leadership lost: another replica may act already, so stop acting now (cancel, not a graceful
        # stop: kopf's stop flag would keep a waiter hung for 5 s) and let the pod restart. Even cancelled,
        # kopf lets its workers handle queued events (new reconciles included) for queueing.exit_timeout
        # (2 s) before it cancels them: none here. A clean stop (SIGTERM) keeps that grace.
        log.error("stopping: this replica is no longer the leader", extra={"error": str(keeper.exception())})
        settings.queueing.exit_timeout = 0
        operator.cancel()
        await asyncio.wait({operator}, timeout=STOP_GRACE_S)
        return 1
    # kopf stopped (a signal, or its own failure): hand the Lease over at once.
    keeper.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await keeper
    await elector.release()
    operator.result()
    return 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rlboost.observability import serve_http, setup_logging

    setup_logging("operator", args.log_level)
    serve_http(args.metrics_port)  # /metrics and a trivial /healthz; kopf's probe is on --liveness-port

    if not args.leader_elect:
        from rlboost_operator.metrics import LEADER

        LEADER.set(1)  # the only replica acts: no RLBoostOperatorNoLeader
        asyncio.run(run_kopf(args))
        return
    raise SystemExit(asyncio.run(run_elected(args)))


if __name__ == "__main__":
    main()
