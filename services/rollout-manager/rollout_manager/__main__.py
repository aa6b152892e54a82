"""Run the rollout-manager service.

    python -m rollout_manager --config job.yaml --port 50051 --metrics-port 9101 \
        --nats-url nats://127.0.0.1:4222 --namespace default --job local --host 127.0.0.1

`--nats-url ''` runs without preemption notices. With `--credentials-dir` every call needs its role's bearer token
(identity.py) and the port serves TLS when the directory holds `tls-manager.crt`. Adaptive partial-response offload starts from a
window of `rollout.offloadWindowS` seconds in the job spec (0 = off); `--offload-window S` overrides it. A port in use or an
unreachable NATS prints one line and exits with code 1. The flags (each also RLBOOST_<FLAG>) are the fields of
`rlboost.options.manager.ManagerOptions`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from rlboost.auth.nats import connect_options
from rlboost.observability import serve_http, setup_logging
from rlboost.options.base import parse_service_args
from rlboost.options.manager import ManagerOptions

log = logging.getLogger("rollout_manager")


def offload_window_s(args: ManagerOptions) -> float:
    """The flag (or RLBOOST_OFFLOAD_WINDOW) wins over the job spec's rollout.offloadWindowS."""
    return args.spec.rollout.offload_window_s if args.offload_window is None else args.offload_window


def ticket_book(args: ManagerOptions):
    """Assignment tickets keyed with the job's manager-ticket.key (None without credentials: open, unchecked)."""
    if not args.credentials_dir:
        return None
    from pathlib import Path

    from rlboost.auth.credentials import JobCredentials

    from .tickets import TicketBook

    return TicketBook(JobCredentials(Path(args.credentials_dir)).ticket_key(), args.job)


def colocation_ack_keys(args: ManagerOptions):
    """worker id -> that reserved worker's colocation-ack key, from the job's colocation.key (None without
    credentials: no keys given, and the trainer checks no acks)."""
    if not args.credentials_dir:
        return None
    import functools
    from pathlib import Path

    from rlboost.auth.colocation_acks import worker_ack_key
    from rlboost.auth.credentials import JobCredentials

    return functools.partial(worker_ack_key, JobCredentials(Path(args.credentials_dir)).colocation_key(), args.job)


async def serve(args: ManagerOptions, started: list | None = None) -> int:
    """Run until SIGTERM/SIGINT; the server is appended to `started` (what /healthz asks) once it exists."""
    from rlboost.auth.credentials import CredentialsError
    from rlboost.auth.grpc_auth import ServerAuth
    from rlboost.auth.worker_identity import WorkerIdentityVerifier

    from .identity import METHOD_ROLES
    from .preemption import NatsUnavailableError, PreemptionSubscriber
    from .server import PortInUseError, RolloutManagerServer

    try:
        auth = ServerAuth.from_dir(args.credentials_dir, "manager", METHOD_ROLES)
        tickets = ticket_book(args)
        ack_keys = colocation_ack_keys(args)
        identities = WorkerIdentityVerifier.from_credentials(args.credentials_dir, args.job)
    except CredentialsError as err:
        print(f"rollout-manager: --credentials-dir: {err}", file=sys.stderr)
        return 1

    offload = None
    window_s = offload_window_s(args)
    if window_s > 0:
        from rlboost.policies.offload import OffloadConfig, OffloadWindow

        offload = OffloadWindow(OffloadConfig(initial_s=window_s))
    manager = RolloutManagerServer(
        args.spec.rollout,
        balance_interval_s=args.balance_interval,
        offload=offload,
        auth=auth,
        tickets=tickets,
        colocation_ack_key=ack_keys,
        identities=identities,
        register_timeout_s=args.register_timeout,
    )
    if started is not None:
        started.append(manager)
    subscriber = None
    try:
        if args.nats_url:
            subscriber = PreemptionSubscriber(
                args.nats_url,
                args.namespace,
                args.job,
                lambda node, workers, reason: manager.state.drain(node, workers, reason, manager.clock()),
                manager.kick,
                nats_options=connect_options(args.credentials_dir, "manager"),
            )
            await subscriber.start(wait_s=args.nats_wait)
        port = await manager.start(args.host, args.port)
    except (PortInUseError, NatsUnavailableError) as err:
        print(f"rollout-manager: {err}", file=sys.stderr)
        if subscriber is not None:
            await subscriber.stop()
        return 1
    log.info("ready", extra={"port": port, "nats": args.nats_url or "off"})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    if subscriber is not None:
        await subscriber.stop()
    await manager.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args(ManagerOptions, argv)
    setup_logging("rollout-manager", args.log_level)
    started: list = []  # the manager, once serve() made it; healthy until then (it may be waiting for NATS)
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, health=lambda: all(m.healthy() for m in started), host=args.host)
        except OSError as err:
            print(
                f"rollout-manager: cannot serve metrics on {args.host}:{args.metrics_port}: {err.strerror}",
                file=sys.stderr,
            )
            return 1
    return asyncio.run(serve(args, started))


if __name__ == "__main__":
    sys.exit(main())
