"""Pure validation of an RLJob spec beyond its schema: what the API server cannot check.

`check_job(spec_dict, settings)` returns a JobSpec or raises SpecProblemError naming the field.
The reward's entry point and module are located without being imported (no heavy imports in the operator).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path

from rlboost.reward_registry import RewardNameError, check_reward_name, reward_terms
from rlboost.spec import JobSpec, JobSpecError, parse_job_spec
from rlboost_operator.config import OperatorSettings


class SpecProblemError(ValueError):
    """An RLJob that cannot run; `field` is the spec path at fault (e.g. 'trainer.ranks')."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field

    @property
    def path(self) -> str:
        """Where in the RLJob: `spec.<field>`, or the field itself when it is outside the spec (a label)."""
        return self.field if self.field.startswith("metadata.") else f"spec.{self.field}"


def _module_origin(module: str) -> str | None:
    """Where a dotted module's source lives, found on sys.path without executing any package."""
    parts = module.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0])
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    if spec is None:
        return None
    return spec.origin or "namespace"


def _defines(origin: str, name: str) -> bool:
    """Whether a Python source file defines `name` at top level (by parsing, not importing)."""
    path = Path(origin)
    if path.suffix != ".py" or not path.exists():
        return True  # compiled or extension module: cannot tell without importing; trust it
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == name for a in node.names):
            return True
    return False


def check_reward(name: str) -> None:
    """`task.reward` names a registered entry point whose module is installed and defines the function (found in
    package metadata and by parsing its source: nothing of the reward is imported or run in the operator)."""
    try:
        target = check_reward_name(name)
    except RewardNameError as err:
        raise SpecProblemError("task.reward", str(err)) from None
    module, _, func = target.partition(":")
    origin = _module_origin(module)
    if origin is None:
        raise SpecProblemError(
            "task.reward", f"task.reward {name!r}: its module {module!r} is not installed in the job's images"
        )
    if origin != "namespace" and not _defines(origin, func.split(".")[0]):
        raise SpecProblemError("task.reward", f"task.reward {name!r}: module {module!r} defines no {func!r}")


def check_job(data: object, settings: OperatorSettings) -> JobSpec:
    """Validate an RLJob's spec: schema, consistency and the operator's limits."""
    try:
        spec = parse_job_spec(data, "RLJob.spec")
    except JobSpecError as err:
        field = next((p.path for p in err.problems if p.path), "spec")  # the first field named, else the whole spec
        raise SpecProblemError(field, str(err)) from None
    ranks = spec.trainer.ranks
    if ranks > settings.max_trainer_ranks:
        raise SpecProblemError(
            "trainer.ranks",
            f"trainer.ranks ({ranks}) is more than the trainer pool holds ({settings.max_trainer_ranks}); lower it",
        )
    gpus = ranks * spec.trainer.gpus_per_rank
    if gpus > settings.max_trainer_gpus:
        raise SpecProblemError(
            "trainer.gpusPerRank",
            f"trainer.ranks x trainer.gpusPerRank ({gpus}) is more than the trainer pool's accelerators "
            f"({settings.max_trainer_gpus}); lower either",
        )
    if spec.model.source == "path":
        raise SpecProblemError(
            "model.source",
            "model.source 'path' names a directory on one machine (rlboost local); on Kubernetes use 'pvc' "
            "(claimName + path), 'uri' (s3:// or gs://), 'huggingface' (repo) or 'tiny'",
        )
    for name, _, _ in reward_terms(spec.task.reward):  # a name, or each of a weighted list
        check_reward(name)
    check_dataset_locations(spec)
    check_overlays(spec, settings)
    return spec


def check_overlays(spec: JobSpec, settings: OperatorSettings) -> None:
    """Each component's podTemplate fits the pod the operator builds (a container it names exists, a volume it
    mounts is there): the children are built once, as they would be, and an overlay that does not fit is named."""
    from rlboost_operator.children import OverlayError, build_children

    try:
        build_children("job", "namespace", spec, settings, spec.rollout.spot.replicas)
    except OverlayError as err:
        raise SpecProblemError(err.field, str(err)) from None


def check_dataset_locations(spec: JobSpec) -> None:
    """task.dataset's splits are URIs or absolute paths inside the trainer's pod (no data is read here: the trainer
    checks columns and rows before its first step and fails the job with the field named)."""
    data = spec.task.active_dataset
    for name in ("train", "validation"):
        value = getattr(data, name) if data is not None else ""
        if value and "://" not in value and not value.startswith("/"):
            raise SpecProblemError(
                f"task.dataset.{name}",
                f"task.dataset.{name} {value!r} is a relative path, which means nothing inside the trainer's pod; "
                "give an absolute path there (e.g. a mounted volume) or an s3://, gs:// or hf://datasets/ URI",
            )


# The labels Kueue reads (kueue.py) name Kueue objects: a LocalQueue in the job's namespace, a WorkloadPriorityClass.
KUEUE_NAME_LABELS = ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/priority-class")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_labels(labels: Mapping[str, str] | None) -> None:
    """The RLJob's Kueue labels name Kueue objects: each a DNS subdomain (as Kueue's webhooks require)."""
    for key in KUEUE_NAME_LABELS:
        value = (labels or {}).get(key)
        if value is not None and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
            raise SpecProblemError(
                f'metadata.labels["{key}"]',
                f"{value!r} is not the name of a Kueue object: lower case letters, digits, '-' and '.', starting and "
                "ending with a letter or digit",
            )
