"""`rlboost validate rljob.yaml...` and `rlboost render rljob.yaml`: an RLJob checked, and the objects the operator
would create for it printed, offline, by the operator's own code (rlboost_operator.offline: its CRD schema and CEL
rules, its checks, its builders), so that they cannot drift from what a cluster does.

Like `rlboost serve operator`, this replaces the process with `python -m rlboost_operator.offline <verb> ...` (the
same interpreter): the core imports no service (import-linter's "The core imports no service"), and the operator's
package and its extra (`pip install 'rlboost[tools]'`: kopf, cel-python, jsonschema) are only needed when the verb
runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

OPERATOR_MODULE = "rlboost_operator.offline"
HELP = {
    "validate": "check RLJob manifests offline: the CRD's schema and CEL rules, reward names, the model source, "
    "pod-template overlays (one line per problem, naming the field; exit 1 on any)",
    "render": "print the objects the operator would create for an RLJob, as YAML (GitOps review, policy checks); the "
    "operator's settings from RLBOOST_OPERATOR_* variables",
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("validate", help=HELP["validate"], description=HELP["validate"])
    v.add_argument("files", nargs="+", metavar="RLJOB.yaml", help="manifests (each RLJob document in them)")
    v.set_defaults(func=run, verb="validate")
    r = sub.add_parser("render", help=HELP["render"], description=HELP["render"])
    r.add_argument("file", metavar="RLJOB.yaml", help="a manifest with one RLJob")
    r.add_argument("--namespace", "-n", help="the job's namespace (default: the manifest's, else default)")
    r.add_argument("--spot-replicas", type=int, help="spot workers asked for (default: the pool's initial count)")
    r.set_defaults(func=run, verb="render")


def operator_argv(args: argparse.Namespace) -> list[str]:
    """The operator module's command line for the parsed verb."""
    argv = [sys.executable, "-m", OPERATOR_MODULE, args.verb]
    if args.verb == "validate":
        return [*argv, *args.files]
    argv.append(args.file)
    if args.namespace:
        argv += ["--namespace", args.namespace]
    if args.spot_replicas is not None:
        argv += ["--spot-replicas", str(args.spot_replicas)]
    return argv


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("rlboost_operator") is None:
        print(
            f"rlboost {args.verb}: the operator's package is not installed: pip install 'rlboost[tools]'",
            file=sys.stderr,
        )
        return 2
    argv = operator_argv(args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached
