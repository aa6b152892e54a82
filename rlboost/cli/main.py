"""The `rlboost` command line: `rlboost local`, `rlboost serve <component>`, `rlboost validate` / `render` (the
operator's checks and builders, offline), and verbs other packages add.

Run `rlboost --help` (console script) or `python -m rlboost.cli.main --help`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rlboost.cpu_numerics import CPU_NUMERICS_ENV

# The CLI forks children while its gRPC client threads poll the manager: gRPC's fork handlers only
# log "skipping fork() handlers" noise there, and children exec at once. Set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
# The same arithmetic on every x86 machine, in this process too (it creates the tiny model's initial weights, and
# children inherit it): torch reads these on its first kernel, so before torch is imported. The user's values win.
for _name, _value in CPU_NUMERICS_ENV.items():
    os.environ.setdefault(_name, _value)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("rlboost")
    except Exception:  # (not installed: running from a source tree)
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from rlboost.cli import delta_cmd, local_cmd, offline_cmd, serve_cmd, simulate_cmd

    parser = argparse.ArgumentParser(
        prog="rlboost",
        description="RL post-training for LLMs: spot GPUs for rollout, sparse bit-exact weight sync.",
    )
    parser.add_argument("--version", action="version", version=f"rlboost {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for verb in (local_cmd, serve_cmd, simulate_cmd, delta_cmd, offline_cmd):
        verb.add_parser(sub)  # each verb module imports its heavy dependencies only when it runs
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("rlboost: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
