"""Flags every service shares, each also settable by an environment variable (RLBOOST_<FLAG>).

A container passes flags or env; `rlboost local` passes flags. Example:

    parser = service_parser("rollout-manager", "The rollout-manager gRPC service.")
    parser.add_argument("--port", type=int, default=env_default("port", 50051))
    args = parse_service_args(parser)   # also loads args.config -> args.spec (JobSpec)
"""

from __future__ import annotations

import argparse
import os
import sys

from rlboost.spec import JobSpec, JobSpecError, load_job_spec


def env_default(flag: str, default: object) -> object:
    """The value of RLBOOST_<FLAG> if set, else the default (flag 'metrics-port' -> RLBOOST_METRICS_PORT)."""
    return os.environ.get("RLBOOST_" + flag.upper().replace("-", "_"), default)


def service_parser(service: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"rlboost serve {service}", description=description)
    parser.add_argument("--config", default=env_default("config", ""), help="job spec YAML (defaults when empty)")
    parser.add_argument("--namespace", default=env_default("namespace", "default"), help="NATS subject namespace")
    parser.add_argument("--job", default=env_default("job", "local"), help="job name (NATS subjects, metrics labels)")
    parser.add_argument("--nats-url", default=env_default("nats-url", "nats://127.0.0.1:4222"), help="NATS server URL")
    parser.add_argument("--host", default=env_default("host", "127.0.0.1"), help="address to listen on")
    parser.add_argument("--log-level", default=env_default("log-level", "INFO"), help="DEBUG, INFO, WARNING, ERROR")
    return parser


def parse_service_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse flags and load the job spec into `args.spec`; a bad config exits with one clear message."""
    args = parser.parse_args(argv)
    try:
        args.spec = load_job_spec(args.config) if args.config else JobSpec()
    except JobSpecError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        sys.exit(2)
    return args
