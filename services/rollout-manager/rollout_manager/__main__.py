"""Run the rollout-manager service.

    python -m rollout_manager --config job.yaml --port 50051 --metrics-port 9101 \
        --nats-url nats://127.0.0.1:4222 --namespace default --job local --host 127.0.0.1

`--nats-url ''` runs without preemption notices. Adaptive partial-response offload starts from a
window of `rollout.offloadWindowS` seconds in the job spec (0 = off); `--offload-window S` overrides it. A port in use or an
unreachable NATS prints one line and exits with code 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from rlboost.observability import serve_http, setup_logging
from rlboost.service_args import env_default, parse_service_args, service_parser

log = logging.getLogger("rollout_manager")


def build_parser():
    parser = service_parser("rollout-manager", "The rollout-manager: the single scheduler of rollout work (gRPC).")
    parser.add_argument("--port", type=int, default=int(env_default("port", 50051)), help="gRPC port")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env_default("metrics-port", 9101)),
        help="/metrics and /healthz port (0 = off)",
    )
    parser.add_argument(
        "--offload-window",
        type=float,
        default=env_default("offload-window", None),
        help="initial adaptive offload window T in seconds; 0 = never offload reserved work "
        "(default: the job spec's rollout.offloadWindowS)",
    )
    parser.add_argument(
        "--balance-interval",
        type=float,
        default=float(env_default("balance-interval", 1.0)),
        help="seconds between balancing passes",
    )
    return parser


def offload_window_s(args) -> float:
    """The flag (or RLBOOST_OFFLOAD_WINDOW) wins over the job spec's rollout.offloadWindowS."""
    return args.spec.rollout.offload_window_s if args.offload_window is None else args.offload_window


async def serve(args) -> int:
    from .preemption import NatsUnavailableError, PreemptionSubscriber
    from .server import PortInUseError, RolloutManagerServer

    offload = None
    window_s = offload_window_s(args)
    if window_s > 0:
        from rlboost.policies.offload import OffloadConfig, OffloadWindow

        offload = OffloadWindow(OffloadConfig(initial_s=window_s))
    manager = RolloutManagerServer(args.spec.rollout, balance_interval_s=args.balance_interval, offload=offload)
    subscriber = None
    try:
        if args.nats_url:
            subscriber = PreemptionSubscriber(
                args.nats_url, args.namespace, args.job, manager.state.drain, manager.kick
            )
            await subscriber.start()
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
    args = parse_service_args(build_parser(), argv)
    setup_logging("rollout-manager", args.log_level)
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, host=args.host)
        except OSError as err:
            print(
                f"rollout-manager: cannot serve metrics on {args.host}:{args.metrics_port}: {err.strerror}",
                file=sys.stderr,
            )
            return 1
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
