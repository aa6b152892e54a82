"""`rlboost validate` and `rlboost render`: what the API server and the operator would do with an RLJob manifest,
offline (no cluster), in about a second. `rlboost` (rlboost/cli/offline_cmd.py) runs this module as
`python -m rlboost_operator.offline {validate,render} ...`, as `rlboost serve operator` runs the operator: the core
imports no service.

validate FILE...: each RLJob in each file through what refuses it on a cluster, in order: the CRD's schema (types,
bounds, enums: the API server), its CEL rules (the API server, cel_eval.py), then the operator's checks (checks.py:
the spec's cross-field rules, reward names and modules, the model source's shape, the operator's limits, each
podTemplate against the pod it is merged over). One line per problem naming the field; exit 1 on any.

render FILE: the objects the operator creates for the RLJob, built by its own builders and owned as it owns them
(render.py), as YAML on stdout, for GitOps review and policy checks. The operator's settings come from the same
RLBOOST_OPERATOR_* variables the chart sets on it (config.py); the two Secrets it makes once (tokens, keys, NATS
users) are shown with their items' names only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import yaml

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # an RLJob not yet created has no uid
GENERATED = "rlboost.io/rendered"  # annotation on the Secrets render shows without their values


class Problem(NamedTuple):
    """One reason a cluster would refuse or fail the RLJob: where (`spec.…`), who says so, and why."""

    path: str
    source: str  # "schema", "CEL rule" or "operator"
    message: str

    def line(self, where: str) -> str:
        return f"{where}: {self.path}: {self.message} ({self.source})"


def rljobs(path: Path) -> Iterator[dict[str, Any]]:
    """The RLJob documents of a YAML file (other kinds, e.g. a Secret beside it, are skipped)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "RLJob":
            yield doc


def _schema_problems(schema: dict[str, Any], spec: Any) -> list[Problem]:
    try:
        import jsonschema
    except ImportError:  # the offline tools' extra, not the operator's image
        raise SystemExit("rlboost validate needs jsonschema: pip install 'rlboost[tools]'") from None

    out = []
    for err in sorted(jsonschema.Draft4Validator(schema).iter_errors(spec), key=lambda e: list(e.absolute_path)):
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        out.append(Problem(f"spec{where}", "schema", err.message))
    return out


def problems(job: dict[str, Any]) -> list[Problem]:
    """Everything a cluster would refuse the RLJob for, in the order it would: schema, CEL rules, the operator."""
    from rlboost.spec import JobSpecError, parse_job_spec
    from rlboost_operator import cel_eval, crd
    from rlboost_operator.checks import SpecProblemError, check_job
    from rlboost_operator.config import load_settings

    spec = job.get("spec") or {}
    schema = crd.spec_schema()
    found = _schema_problems(schema, spec)
    if not found:  # the API server evaluates the rules on an object its schema admits
        found += [Problem(r.path, "CEL rule", r.message) for r in cel_eval.refusals(schema, spec)]
    try:
        parse_job_spec(spec, "RLJob.spec")
    except JobSpecError as err:  # the spec's own rules, one problem per field
        found += [Problem(f"spec.{p.path}".rstrip("."), "spec", p.message) for p in err.problems]
        return _first_per_field(found)
    try:
        check_job(spec, load_settings())
    except SpecProblemError as err:  # what the operator adds: rewards, model source, limits, overlays
        found.append(Problem(f"spec.{err.field.removeprefix('spec.')}", "operator", str(err)))
    return _first_per_field(found)


def _first_per_field(found: list[Problem]) -> list[Problem]:
    """One problem per field: the first to refuse it (`kubectl apply` would say that one)."""
    seen: set[str] = set()
    out = []
    for problem in found:
        key = re.sub(r"\[(\d+)\]", r".\1", problem.path)
        if key not in seen:
            seen.add(key)
            out.append(problem)
    return out


def validate(paths: list[Path]) -> int:
    bad = 0
    for path in paths:
        jobs = list(rljobs(path))
        if not jobs:
            print(f"{path}: no RLJob (kind: RLJob) in the file", file=sys.stderr)
            bad += 1
        for job in jobs:
            name = (job.get("metadata") or {}).get("name", "?")
            found = problems(job)
            for problem in found:
                print(problem.line(f"{path} RLJob {name}"), file=sys.stderr)
            if not found:
                print(f"{path}: RLJob {name} is valid")
            bad += bool(found)
    return 1 if bad else 0


def _secrets_without_values(job: str, namespace: str) -> list[dict[str, Any]]:
    """The two Secrets the operator makes once, with their items' names and empty values (not secret material)."""
    from rlboost.auth.credentials import WORKER_IDENTITY_CLUSTER, generate_items
    from rlboost_operator import children

    items = generate_items(children.tls_hosts(job, namespace))
    # the cluster's service-account keys, which the operator adds once it has read them (credentials.py)
    names = [*items, WORKER_IDENTITY_CLUSTER]
    shown = [children.credentials_secret(job, namespace, dict.fromkeys(names, b""))]
    shown.append(children.nats_config_secret(job, namespace, items))
    for secret in shown:
        secret["data"] = dict.fromkeys(secret["data"], "")
        note = "generated by the operator when the RLJob is created; values not shown"
        secret["metadata"]["annotations"] = {GENERATED: note}
    return shown


def rendered(job: dict[str, Any], namespace: str, spot_replicas: int | None) -> list[dict[str, Any]]:
    """The RLJob's children as the operator creates them (lifecycle.apply_children: the Secrets first)."""
    from rlboost.spec import parse_job_spec
    from rlboost_operator import children, render
    from rlboost_operator.config import load_settings

    meta = job.get("metadata") or {}
    name = meta["name"]
    spec = parse_job_spec(job.get("spec") or {}, f"RLJob {name}")
    spot = spec.rollout.spot
    replicas = (
        spot_replicas if spot_replicas is not None else max(spot.min_replicas, min(spot.max_replicas, spot.replicas))
    )
    owner = {
        "apiVersion": job.get("apiVersion", "rlboost.io/v1alpha1"),
        "kind": "RLJob",
        "metadata": {**meta, "namespace": namespace, "uid": meta.get("uid") or PLACEHOLDER_UID},
    }
    built = [
        *_secrets_without_values(name, namespace),
        *children.build_children(
            name, namespace, spec, load_settings(), replicas, job_labels=children.job_labels(meta.get("labels"))
        ),
    ]
    return render.owned(built, owner)


def render_file(path: Path, namespace: str | None, spot_replicas: int | None) -> int:
    jobs = list(rljobs(path))
    if len(jobs) != 1:
        print(f"{path}: render takes a file with one RLJob (found {len(jobs)})", file=sys.stderr)
        return 2
    job = jobs[0]
    found = problems(job)
    if found:
        for problem in found:
            print(problem.line(str(path)), file=sys.stderr)
        return 1
    where = namespace or (job.get("metadata") or {}).get("namespace") or "default"
    objs = rendered(job, where, spot_replicas)
    print(f"# rlboost render: what the operator creates for RLJob {job['metadata']['name']} in namespace {where}")
    print(yaml.safe_dump_all(objs, sort_keys=False, width=120), end="")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rlboost", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    v = sub.add_parser("validate", help="check RLJob manifests offline")
    v.add_argument("files", nargs="+", type=Path)
    r = sub.add_parser("render", help="print the objects the operator would create")
    r.add_argument("file", type=Path)
    r.add_argument("--namespace", "-n", default=None, help="the job's namespace (default: the manifest's, or default)")
    r.add_argument("--spot-replicas", type=int, default=None, help="spot workers asked for (default: the initial)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.verb == "validate":
            return validate(args.files)
        return render_file(args.file, args.namespace, args.spot_replicas)
    except (OSError, yaml.YAMLError) as err:
        print(f"rlboost {args.verb}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
