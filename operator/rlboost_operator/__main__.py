"""Run the rlboost operator: `python -m rlboost_operator [--metrics-port 9090] [--liveness-port 8080]`.

Watches RLJobs cluster-wide (or in --namespace), serves Prometheus /metrics, and kopf's liveness
endpoint at /healthz. Several replicas are safe together: kopf peering (--peering NAME) lets one
replica act at a time; --standalone turns peering off (single replica, tests).
Settings (images, NATS, limits) come from RLBOOST_OPERATOR_* variables (see config.py).
"""

from __future__ import annotations

import argparse
import asyncio

from rlboost.options.base import env_default


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
        "--peering", default=str(env_default("peering", "rlboost")), help="kopf peering name shared by replicas"
    )
    p.add_argument("--standalone", action="store_true", help="no peering (a single replica)")
    p.add_argument("--log-level", default=str(env_default("log-level", "INFO")), help="DEBUG, INFO, WARNING, ERROR")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from rlboost.observability import serve_http, setup_logging

    setup_logging("operator", args.log_level)
    serve_http(args.metrics_port)  # /metrics and a trivial /healthz; kopf's probe is on --liveness-port

    import kopf

    import rlboost_operator.handlers  # noqa: F401 (registers the handlers)

    asyncio.run(
        kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=args.standalone,
            peering_name=args.peering,
            liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz",
        )
    )


if __name__ == "__main__":
    main()
