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

from rlboost import pod_policy
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
        Rule(
            f"{v('algorithm.rolloutAhead')} == 0 || ({v('algorithm.maxStaleness')} >= 1 && "
            f"!{v('algorithm.partialRollout')} && !{v('trainer.colocateReserved')})",
            "spec.algorithm.rolloutAhead trains on samples one weight version behind: it needs "
            "spec.algorithm.maxStaleness >= 1, and neither spec.algorithm.partialRollout nor "
            "spec.trainer.colocateReserved",
            "algorithm.rolloutAhead",
        ),
        *_episode_rules(v),
        *_pool_account_rules(),
        _trainer_gpu_rule(),
        Rule(
            f'{v("trainer.backend")} != "nccl" || {v("trainer.gpusPerRank")} >= 1',
            "spec.trainer.backend 'nccl' needs GPUs: set spec.trainer.gpusPerRank >= 1 or use 'gloo'/'auto'",
            "trainer.backend",
        ),
        Rule(  # issue 31: a job with no rollout worker would wait forever for its first step
            f"{v('rollout.reserved.replicas')} >= 1 || {v('rollout.spot.maxReplicas')} >= 1",
            "spec.rollout.reserved.replicas and spec.rollout.spot.maxReplicas are both 0: the job would have no "
            "rollout worker; set one of them >= 1",
            "rollout.reserved.replicas",
        ),
        *_algorithm_variant_rules(),
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
    ]


def _algorithm_variant_rules() -> list[Rule]:
    """AlgorithmSpec's own validator (the GRPO-family variants): dualClip and klInReward."""
    # double(): a `number` field written as an integer (dualClip: 3) is an int to some CEL evaluators
    dual, kl_coef = (f"double({value('self', f'algorithm.{name}')})" for name in ("dualClip", "klCoef"))
    return [
        Rule(
            f"{dual} == 0.0 || {dual} > 1.0",
            "spec.algorithm.dualClip must be > 1 (veRL's default is 3), or 0 for off",
            "algorithm.dualClip",
        ),
        Rule(
            f"!{value('self', 'algorithm.klInReward')} || {kl_coef} > 0.0",
            "spec.algorithm.klInReward puts klCoef x KL into the reward: set spec.algorithm.klCoef > 0",
            "algorithm.klInReward",
        ),
        _trainer_old_logprobs_rule(),
    ]


def _trainer_old_logprobs_rule() -> Rule:
    """rolloutCorrection.oldLogprobs 'trainer' (JobSpec._check_old_logprobs): rows one version behind, whole weights."""
    v = lambda path: value("self", path)  # noqa: E731
    return Rule(
        f'{v("algorithm.rolloutCorrection.oldLogprobs")} != "trainer" || ('
        f'{v("algorithm.rolloutCorrection.mode")} == "none" && {v("algorithm.maxStaleness")} == 1 && '
        f"!{v('algorithm.partialRollout')} && {v('trainer.zeroStage')} != 3)",
        "spec.algorithm.rolloutCorrection.oldLogprobs 'trainer' scores stale rows under the weights of one version "
        "before, kept whole on every rank: it needs spec.algorithm.rolloutCorrection.mode 'none', "
        "spec.algorithm.maxStaleness 1, no spec.algorithm.partialRollout and spec.trainer.zeroStage 0, 1 or 2",
        "algorithm.rolloutCorrection.oldLogprobs",
    )


def _pool_account_rules() -> list[Rule]:
    """A worker pool runs as the operator's account of its pool (rlboost.pod_policy.no_account_name)."""
    return [
        Rule(
            f'{value("self", f"rollout.{pool}.serviceAccount.name")} == ""',
            f"spec.rollout.{pool}.serviceAccount.name must be empty: a worker pool runs as the operator's "
            f"<job>-{pool}-worker account (the manager checks its token to know the pool); set "
            "serviceAccount.annotations instead",
            f"rollout.{pool}.serviceAccount.name",
        )
        for pool in ("reserved", "spot")
    ]


def _trainer_gpu_rule() -> Rule:
    """trainer.gpusPerRank at most 1 (rlboost.spec.TrainerSpec: a pod runs one rank, one process)."""
    return Rule(
        f"{value('self', 'trainer.gpusPerRank')} <= 1",
        "spec.trainer.gpusPerRank must be 0 or 1: a rank is one process on one accelerator (a pod runs one rank); "
        "for N GPUs per node set gpusPerRank 1 and multiply spec.trainer.ranks by N",
        "trainer.gpusPerRank",
    )


def _none_of(names: list[str] | tuple[str, ...], expr: str) -> str:
    return f"!({expr} in {json.dumps(sorted(names))})"


def _no_prefix(prefixes: tuple[str, ...], expr: str) -> str:
    return " && ".join(f"!{expr}.startsWith({json.dumps(p)})" for p in prefixes)


def _keys_without(field: str, prefixes: tuple[str, ...]) -> str:
    return f"!has(self.{field}) || self.{field}.all(k, {_no_prefix(prefixes, 'k')})"


def node_rules() -> dict[str, list[Rule]]:
    """Rules on the models of rlboost.pod_policy, by model name, wherever the spec uses them (each component's
    pod policy): what the operator owns in a pod, refused at apply with the field named (its path is the node's,
    which the API server puts before the message). The same checks as the models' validators."""
    owned_env = f"{_none_of(pod_policy.OWNED_ENV, 'self.name')} && !self.name.startsWith({json.dumps(pod_policy.OWNED_ENV_PREFIX)})"
    refused = {"serviceAccountName": "serviceAccount", "serviceAccount": "serviceAccount",
               "automountServiceAccountToken": "serviceAccount", "priorityClassName": "priorityClassName",
               "imagePullSecrets": "imagePullSecrets"}  # fmt: skip
    return {
        "OverlayContainer": [
            Rule(
                f"!has(self.{key})",
                f"the operator owns each container's {key} (rendered from the spec); remove it from podTemplate",
                key,
                "FieldValueForbidden",
            )  # fmt: skip
            for key in ("command", "args")
        ]
        + [
            Rule(
                f"!has(self.{key})",
                f"set {key} on the component (every container gets it), not in podTemplate",
                key,
                "FieldValueForbidden",
            )  # fmt: skip
            for key in ("env", "envFrom")
        ],
        "OverlayVolume": [
            Rule(
                _none_of(pod_policy.OWNED_VOLUMES, "self.name"),
                "this volume is the operator's (the job file, credentials or identity token): use another name",
                "name",
                "FieldValueForbidden",
            )  # fmt: skip
        ],
        "OverlayMount": [
            Rule(
                _none_of(pod_policy.OWNED_VOLUMES, "self.name"),
                "this volume is the operator's (the job file, credentials or identity token)",
                "name",
                "FieldValueForbidden",
            ),  # fmt: skip
            Rule(
                _no_prefix(pod_policy.OWNED_PATH_PREFIXES, "self.mountPath"),
                f"mountPath is under the operator's {', '.join(pod_policy.OWNED_PATH_PREFIXES)}",
                "mountPath",
                "FieldValueForbidden",
            ),  # fmt: skip
        ],
        "OverlayPodSpec": [
            Rule(
                f"!has(self.{key})",
                f"podTemplate.spec.{key} is the operator's; set the component's {fix}",
                key,
                "FieldValueForbidden",
            )  # fmt: skip
            for key, fix in refused.items()
        ],
        "OverlayMetadata": [
            Rule(
                _keys_without(kind, pod_policy.OWNED_KEY_PREFIXES),
                f"{kind}: rlboost.io/ and app.kubernetes.io/ keys are the operator's",
                kind,
                "FieldValueForbidden",
            )  # fmt: skip
            for kind in ("labels", "annotations")
        ]
        + [
            Rule(
                f"!has(self.{kind}) || self.{kind}.all(k, k.matches({json.dumps(pod_policy.QUALIFIED_KEY)}))",
                f"{kind}: a key is an optional DNS-subdomain prefix and '/', then a name (e.g. team/cost)",
                kind,
            )  # fmt: skip
            for kind in ("labels", "annotations")
        ]
        + [
            Rule(
                f"!has(self.labels) || self.labels.all(k, self.labels[k].matches({json.dumps(pod_policy.LABEL_VALUE)}))",
                "labels: a value is at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric",
                "labels",
            ),  # fmt: skip
        ],
        "OverlayResources": [
            Rule(
                f'!has(self.limits) || !("{pod_policy.GPU_RESOURCE}" in self.limits)',
                "set accelerators with gpusPerRank / gpusPerWorker, not podTemplate",
                "limits",
                "FieldValueForbidden",
            ),  # fmt: skip
            Rule(
                f'!has(self.requests) || (!("{pod_policy.GPU_RESOURCE}" in self.requests) && !("cpu" in '
                'self.requests) && !("memory" in self.requests))',
                "CPU and memory requests come from the "
                "component's resources field, accelerators from gpusPerRank / gpusPerWorker",
                "requests",
                "FieldValueForbidden",
            ),  # fmt: skip
        ],
        "EnvVar": [
            Rule(
                owned_env, "this env variable is set by the operator; use another name", "name", "FieldValueForbidden"
            ),
            Rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both", "valueFrom"),
        ],
        "EnvVarSource": [
            Rule(
                "[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)].filter(x, x).size() == 1",
                "valueFrom needs exactly one of secretKeyRef, configMapKeyRef or fieldRef",
                "",
            )  # fmt: skip
        ],
        "EnvFromSource": [
            Rule(
                "has(self.secretRef) != has(self.configMapRef)",
                "envFrom needs exactly one of secretRef or configMapRef",
                "",
            ),  # fmt: skip
            Rule(
                f"!has(self.prefix) || {_no_prefix((pod_policy.OWNED_ENV_PREFIX,), 'self.prefix')}",
                f"{pod_policy.OWNED_ENV_PREFIX}* variables are the operator's",
                "prefix",
                "FieldValueForbidden",
            ),  # fmt: skip
        ],
        "ServiceAccountSpec": [
            Rule(
                '!has(self.name) || self.name == "" || !has(self.annotations) || size(self.annotations) == 0',
                "serviceAccount.name is an existing account (annotate it yourself); annotations are for the "
                "operator-made one",
                "annotations",
            ),  # fmt: skip
        ],
    }


def spec_rules() -> list[Rule]:
    """The rules on RLJob.spec: immutable fields first, then the cross-field checks."""
    return [*immutable_rules(), model_presence_rule(), *cross_field_rules()]
