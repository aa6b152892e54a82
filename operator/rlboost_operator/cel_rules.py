"""CEL validation rules of the RLJob CRD (`x-kubernetes-validations`), generated from rlboost.spec.JobSpec:
what `kubectl apply` refuses before the operator sees it.

- Immutable fields: what a running job's checkpoints were written for (the trainer's resume check,
  services/trainer/trainer/resume.py `Checkpoints`: world size, ZeRO stage, task seed, prompts per step) and
  the model. Transition rules (`oldSelf`): the API server evaluates them on updates only.
- Cross-field checks: the same as JobSpec's and PoolSpec's model validators, each naming its field
  (`fieldPath`, and the message). What needs the operator's settings (trainer pool limits) or its image
  (the reward module) stays in rlboost_operator.checks.

A field left out of the object is read as the operator reads it: the API server applies the schema's
defaults to fields of objects that are present, but an object left out gets its pydantic `default_factory`'s
values (e.g. `rollout.spot.replicas` is 2 when `rollout.spot` is absent). `value(var, path)` writes that as
nested `has()` guards, so every rule holds with or without the API server's defaulting.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rlboost.spec import JobSpec

# What a running job's checkpoints depend on: the trainer refuses to resume when one changed.
RESUME_FIELDS = ("trainer.ranks", "trainer.zeroStage", "task.seed", "algorithm.promptsPerStep")
RECREATE = (
    "delete the RLJob and create it again (its checkpoints are for the old value: a new name, or delete its PVCs)"
)


class Rule(NamedTuple):
    """One x-kubernetes-validations entry; `field`: the spec path it is about (no leading 'spec.')."""

    rule: str
    message: str
    field: str
    reason: str = "FieldValueInvalid"

    def manifest(self, node: str = "") -> dict[str, Any]:
        """The CRD entry for a rule placed on the schema node at spec path `node` ('' = spec itself)."""
        out = {"rule": self.rule, "message": self.message, "reason": self.reason}
        relative = self.field.removeprefix(node).removeprefix(".") if node else self.field
        if relative:
            out["fieldPath"] = f".{relative}"
        return out


def _field(model: type[BaseModel], alias: str) -> tuple[str, FieldInfo]:
    for name, info in model.model_fields.items():
        if (info.alias or name) == alias:
            return name, info
    raise KeyError(f"{model.__name__} has no field {alias!r}")


def _dig(value: Any, path: list[str]) -> Any:
    """A default model instance's value at a camelCase path."""
    for alias in path:
        name, _ = _field(type(value), alias)
        value = getattr(value, name)
    return value


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no CEL literal for {value!r}")


def value(var: str, path: str, model: type[BaseModel] = JobSpec) -> str:
    """CEL for the spec field at `path` (camelCase, dotted) of `var`, its pydantic default where it is left out."""
    head, *rest = path.split(".")
    _, info = _field(model, head)
    expr = f"{var}.{head}"
    default = info.get_default(call_default_factory=True)
    if not rest:
        return f"(has({expr}) ? {expr} : {_literal(default)})"
    inner = value(expr, ".".join(rest), info.annotation)  # type: ignore[arg-type]
    return f"(has({expr}) ? {inner} : {_literal(_dig(default, rest))})"


def immutable_rules() -> list[Rule]:
    """`spec.X cannot change` for each field the checkpoints depend on (transition rules)."""
    return [
        Rule(
            f"{value('self', path)} == {value('oldSelf', path)}",
            f"spec.{path} cannot change after the job is created: the trainer's checkpoints depend on it; {RECREATE}",
            path,
            "FieldValueForbidden",
        )
        for path in RESUME_FIELDS
    ]


def model_presence_rule() -> Rule:
    """On spec: spec.model neither added nor removed by an edit (the rule on spec.model compares it when both
    the old and the new object have it)."""
    message = f"spec.model cannot be added or removed after the job is created; {RECREATE}"
    return Rule("has(self.model) == has(oldSelf.model)", message, "model", "FieldValueForbidden")


def model_rules() -> list[Rule]:
    """On spec.model itself: the policy being trained cannot change mid-run (whatever the model's fields are)."""
    message = f"spec.model cannot change after the job is created: the checkpoints are of this model; {RECREATE}"
    return [Rule("self == oldSelf", message, "model", "FieldValueForbidden")]


def _pool_rules() -> list[Rule]:
    out = []
    for pool in ("reserved", "spot"):
        low, high = f"rollout.{pool}.minReplicas", f"rollout.{pool}.maxReplicas"
        out.append(
            Rule(
                f"{value('self', low)} <= {value('self', high)}",
                f"spec.{low} must be <= spec.{high}",
                low,
            )
        )
        out += _tensor_parallel_rules(f"rollout.{pool}")
    return out


def _tensor_parallel_rules(pool: str) -> list[Rule]:
    """A pool's tensorParallel against its engine and accelerators (rlboost.spec.check_tensor_parallel)."""
    tp, gpus, engine = (value("self", f"{pool}.{name}") for name in ("tensorParallel", "gpusPerWorker", "engine"))
    return [
        Rule(
            f'{engine} != "torch" || {tp} == 1',
            f"spec.{pool}.tensorParallel must be 1 with engine torch; use engine 'sglang' for tensor parallelism",
            f"{pool}.tensorParallel",
        ),
        Rule(
            f"{tp} <= 1 || {gpus} >= {tp}",
            f"spec.{pool}.gpusPerWorker must be >= spec.{pool}.tensorParallel (one engine shards the model over "
            "that many accelerators of its worker)",
            f"{pool}.gpusPerWorker",
        ),
    ]


def cross_field_rules() -> list[Rule]:
    """JobSpec's and PoolSpec's model validators (rlboost/spec.py), in CEL, each naming the field to change."""
    v = lambda path: value("self", path)  # noqa: E731
    batch = f"({v('algorithm.promptsPerStep')} * {v('algorithm.groupSize')})"
    ranks, micro = v("trainer.ranks"), v("algorithm.microBatchSize")
    per_rank = f"({batch} / {ranks})"
    effective_micro = f"({micro} < {per_rank} ? {micro} : {per_rank})"
    return [
        *_pool_rules(),
        Rule(
            f"{batch} % {ranks} == 0",
            "spec.trainer.ranks must divide spec.algorithm.promptsPerStep x spec.algorithm.groupSize (the batch)",
            "trainer.ranks",
        ),
        Rule(
            f"{batch} % {ranks} != 0 || {per_rank} % {effective_micro} == 0",
            "spec.algorithm.microBatchSize must divide the per-rank batch (promptsPerStep x groupSize / "
            "trainer.ranks) so every rank trains the same number of micro-batches",
            "algorithm.microBatchSize",
        ),
        Rule(
            f"!{v('trainer.colocateReserved')} || {v('rollout.reserved.replicas')} == {ranks}",
            "spec.rollout.reserved.replicas must equal spec.trainer.ranks with spec.trainer.colocateReserved "
            "(one reserved worker shares each trainer rank's accelerators)",
            "rollout.reserved.replicas",
        ),
        Rule(
            f"!{v('algorithm.partialRollout')} || {v('algorithm.maxStaleness')} >= 1",
            "spec.algorithm.partialRollout continues unfinished responses under the next weight version: set "
            "spec.algorithm.maxStaleness >= 1",
            "algorithm.partialRollout",
        ),
        *_episode_rules(v),
        Rule(
            f'{v("trainer.backend")} != "nccl" || {v("trainer.gpusPerRank")} >= 1',
            "spec.trainer.backend 'nccl' needs GPUs: set spec.trainer.gpusPerRank >= 1 or use 'gloo'/'auto'",
            "trainer.backend",
        ),
    ]


def _episode_rules(v) -> list[Rule]:
    """task.environment (agentic episodes): one way to name it, a turn that fits an episode, no partial rollout."""
    name, verifiers = v("task.environment.name"), v("task.environment.verifiers")
    episodes = f'({name} != "" || {verifiers} != "")'
    return [
        Rule(
            f'{name} == "" || {verifiers} == ""',
            "spec.task.environment.verifiers must be empty when spec.task.environment.name is set (one or the other)",
            "task.environment.verifiers",
        ),
        Rule(
            f"!{episodes} || {v('algorithm.maxNewTokens')} < {v('algorithm.maxEpisodeTokens')}",
            "spec.algorithm.maxEpisodeTokens must exceed spec.algorithm.maxNewTokens (one turn's budget) with "
            "spec.task.environment",
            "algorithm.maxEpisodeTokens",
        ),
        Rule(
            f'{verifiers} == "" || ({v("task.dataset.train")} == "" && {v("task.dataset.reasoningGym.name")} == "")',
            "spec.task.environment.verifiers names an environment whose prompts are its own tasks; unset "
            "spec.task.dataset.train and spec.task.dataset.reasoningGym",
            "task.environment.verifiers",
        ),
        Rule(
            f'{v("task.dataset.reasoningGym.name")} == "" || '
            f'({v("task.dataset.train")} == "" && {v("task.dataset.validation")} == "")',
            "spec.task.dataset.reasoningGym is set together with spec.task.dataset.train/validation: the prompts come "
            "from one of them; unset the other",
            "task.dataset.reasoningGym",
        ),
        Rule(
            f"!{episodes} || !{v('algorithm.partialRollout')}",
            "spec.algorithm.partialRollout does not carry episodes across steps yet: turn it off with "
            "spec.task.environment",
            "algorithm.partialRollout",
        ),
    ]


def spec_rules() -> list[Rule]:
    """The rules on RLJob.spec: immutable fields first, then the cross-field checks."""
    return [*immutable_rules(), model_presence_rule(), *cross_field_rules()]
