"""`rlboost serve <component> [args...]`: run one service in the foreground, as a container would.

Replaces this process with `python -m <package> args...` (same interpreter), so signals and the exit
code are the service's own.
"""

from __future__ import annotations

import argparse
import os
import sys

COMPONENTS = {
    "weight-server": "weight_server",
    "rollout-manager": "rollout_manager",
    "rollout-worker": "rollout_worker",
    "trainer": "trainer",
    "env-runner": "env_runner",
    "operator": "rlboost_operator",
}


class UnknownComponentError(ValueError):
    pass


def command_for(component: str, args: list[str]) -> list[str]:
    """argv that runs `component` with `args`; UnknownComponentError lists the choices."""
    try:
        package = COMPONENTS[component]
    except KeyError:
        choices = ", ".join(COMPONENTS)
        raise UnknownComponentError(f"unknown component {component!r}; choose one of: {choices}") from None
    return [sys.executable, "-m", package, *args]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run one service (weight-server, rollout-manager, rollout-worker, trainer, env-runner, operator)",
        description="Run one service in the foreground; every argument after the component goes to it "
        "(e.g. `rlboost serve rollout-manager --config job.yaml --port 50051`).",
    )
    p.add_argument("component", metavar="COMPONENT", help=f"one of: {', '.join(COMPONENTS)}")
    p.add_argument("args", nargs=argparse.REMAINDER, help="flags passed to the service")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        argv = command_for(args.component, list(args.args))
    except UnknownComponentError as err:
        print(f"rlboost serve: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
