"""The RLJob CustomResourceDefinition, generated from rlboost.spec.JobSpec (one source of truth).

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: `$ref`s inlined,
keys the API server rejects dropped (title, const, additionalProperties: false), JSON-Schema
2020 `exclusiveMinimum: x` rewritten to OpenAPI v3.0's `minimum: x, exclusiveMinimum: true`.
Descriptions, bounds, enums and defaults are kept, so `kubectl explain rljob.spec.rollout` helps.
CEL rules (cel_rules.py) make the API server refuse, at `kubectl apply`, edits of fields a running job cannot
change and the specs that JobSpec's cross-field validators refuse.
`scripts/gen_crd.py` writes it into the Helm chart.
"""

from __future__ import annotations

from typing import Any

from rlboost.spec import JobSpec
from rlboost_operator import cel_rules

GROUP = "rlboost.io"
VERSION = "v1alpha1"
PLURAL = "rljobs"
KIND = "RLJob"

_DROP = {"title", "$defs", "examples"}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline every $ref and make each schema node structural."""
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in node.items() if k != "$ref"}}
        rules = cel_rules.node_rules().get(name)
        if rules:  # rules of a model wherever it is used (e.g. a pod-template overlay's containers)
            merged["x-kubernetes-validations"] = [rule.manifest() for rule in rules]
        return _resolve(merged, defs)
    nullable = _nullable(node)
    if nullable is not None:  # `X | None`: OpenAPI v3.0's nullable X, the outer keys (description) kept
        inner = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
        return {**_resolve(nullable, defs), **_resolve(inner, defs), "nullable": True}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or (key == "const" and "enum" in node):
            continue
        if key == "additionalProperties" and value is True:
            out["x-kubernetes-preserve-unknown-fields"] = True  # Kubernetes fields passed through as written
            continue
        if key == "const" and "enum" not in node:
            out["enum"] = [value]  # a Literal with one value; OpenAPI v3.0 has no const
            continue
        if key == "default" and value is None:
            continue  # an optional field's default is its absence (a null default is no value to apply)
        if key == "additionalProperties" and value is False:
            continue  # structural schemas forbid it; the API server prunes unknown fields instead
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
            continue
        out[key] = {k: _resolve(v, defs) for k, v in value.items()} if key == "properties" else _resolve(value, defs)
    return out


def _nullable(node: dict[str, Any]) -> dict[str, Any] | None:
    """The X of a pydantic `X | None` (anyOf [X, null]); None for any other node."""
    options = node.get("anyOf")
    if not isinstance(options, list) or len(options) != 2 or {"type": "null"} not in options:
        return None
    return next(o for o in options if o != {"type": "null"})


def spec_schema() -> dict[str, Any]:
    """The structural OpenAPI v3 schema of RLJob.spec."""
    raw = JobSpec.model_json_schema(by_alias=True)
    schema = _resolve(raw, raw.get("$defs", {}))
    schema["x-kubernetes-validations"] = [rule.manifest() for rule in cel_rules.spec_rules()]
    model = schema["properties"]["model"]
    model["x-kubernetes-validations"] = [rule.manifest("model") for rule in cel_rules.model_rules()]
    return schema


def _num(description: str, kind: str = "number") -> dict[str, Any]:
    return {"type": kind, "description": description}


def _variant_counts(key: str, description: str) -> dict[str, Any]:
    """A list of {name, <key>}: one count per spot variant."""
    item = {"type": "object", "properties": {"name": {"type": "string"}, key: {"type": "integer"}}}
    return {"type": "array", "nullable": True, "items": item, "description": description}


def status_schema() -> dict[str, Any]:
    """The schema of RLJob.status (written by the operator)."""
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Condition type, e.g. Valid, Ready, Failed."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"], "description": "Condition status."},
            "reason": {"type": "string", "description": "One-word reason in CamelCase."},
            "message": {"type": "string", "description": "Human-readable detail; names the offending field."},
            "lastTransitionTime": {"type": "string", "description": "When the status last changed (RFC 3339)."},
            "observedGeneration": _num("The RLJob's metadata.generation this condition was judged on.", "integer"),
        },
    }
    workers = {
        "type": "object",
        "description": "Rollout workers per pool.",
        "properties": {
            "reserved": _num("Ready reserved workers.", "integer"),
            "spot": _num("Ready spot workers.", "integer"),
            "spotDesired": _num("Spot workers the operator asked for, within minReplicas..maxReplicas.", "integer"),
            "spotReason": {
                "type": "string",
                "description": "Why: SpotScaled (capacity of the spot nodes present), SpotAskingAutoscaler "
                "(maxReplicas, for the autoscaler), SpotPendingBackoff (pods stayed unschedulable; retrying later) or "
                "SpotBusyScaled (busy sizing: the lower of the nodes' capacity and spotTarget).",
            },
            "spotMessage": {"type": "string", "description": "The spot ask in words, e.g. when it retries."},
            "spotTarget": {
                "type": "integer",
                "nullable": True,
                "description": "Busy sizing (rollout.spot.sizing 'busy'): the spot workers the step reports keep busy, "
                "within minReplicas..maxReplicas; spotDesired is the lower of it and the spot nodes' capacity. Kept "
                "here so a restarted operator or a new leader carries on with it. Null in other sizings.",
            },
            "spotSplit": _variant_counts(
                "replicas",
                "A spot pool with variants (rollout.spot.variants): spotDesired split across them, cheapest per "
                "request slot first, each up to its maxReplicas and what its nodes hold. Null without variants.",
            ),
            "spotVariants": _variant_counts(
                "ready",
                "A spot pool with variants: ready workers per variant at the last step, each priced at its own "
                "pricePerGpuHour in costPerHour.",
            ),
            "spotAsk": {
                "type": "object",
                "nullable": True,
                "description": "Autoscaler sizing's state, kept here so a restarted operator or a new leader "
                "carries on with it: when the current ask for maxReplicas began, when a back-off retries, the "
                "next back-off.",
                "properties": {
                    "askedAt": {"type": "string", "nullable": True, "description": "RFC 3339."},
                    "retryAt": {"type": "string", "nullable": True, "description": "RFC 3339; set while backing off."},
                    "backoffSeconds": {"type": "number", "nullable": True, "description": "The next back-off."},
                },
            },
        },
    }
    return {
        "type": "object",
        "description": "Observed state of the job, written by the operator.",
        "x-kubernetes-preserve-unknown-fields": True,  # kopf keeps its own progress records here
        "properties": {
            "phase": {
                "type": "string",
                "enum": ["Pending", "Running", "Suspended", "Succeeded", "Failed"],
                "description": "Lifecycle phase; Suspended: every child at zero (spec.suspend, or Kueue has not "
                "admitted the job or preempted it: status.suspension says which).",
            },
            "conditions": {"type": "array", "items": condition, "description": "Latest observations."},
            "step": _num("Last finished optimizer step.", "integer"),
            "weightVersion": _num("Weight version published by the trainer.", "integer"),
            "rewardMean": _num("Mean reward of the last step."),
            "tokensPerSecond": _num("Response tokens per second of the last step."),
            "validation": {
                "type": "object",
                "description": "The last evaluation on the validation prompts (spec.evaluation).",
                "properties": {
                    "step": _num("Step after which it ran.", "integer"),
                    "weightVersion": _num("Weight version evaluated.", "integer"),
                    "k": _num("Responses per prompt (evaluation.samples).", "integer"),
                    "prompts": _num("Validation prompts evaluated.", "integer"),
                    "rewardMean": _num("Mean reward of the validation responses."),
                    "passAt1": _num("Unbiased pass@1."),
                    "passAtK": _num("Unbiased pass@k, k = evaluation.samples."),
                    "responseTokensMean": _num("Mean response length in tokens."),
                },
            },
            "workers": workers,
            "costPerHour": _num("USD per hour at the current accelerator counts and the job's prices."),
            "costSoFar": _num("USD spent since the job started running."),
            "costEfficiency": _num("Response tokens per USD at the last step."),
            "preemptedSlotShare": _num(
                "Share of the last step's rollout slot-seconds lost to preemptions (StepReport.preempted_slot_share)."
            ),
            "observedGeneration": _num("The RLJob's metadata.generation the operator last reconciled.", "integer"),
            **progress_schema(),
            **queueing_schema(),
            "startedAt": {"type": "string", "description": "When the job was first reconciled (RFC 3339)."},
            "updatedAt": {"type": "string", "description": "Last status update (RFC 3339)."},
        },
    }


def progress_schema() -> dict[str, Any]:
    """Progress as Kubeflow Trainer's TrainJob reports it (steps done against the total, a percentage, an estimate
    of the time left), and the trainer's restarts."""
    return {
        "stepsCompleted": _num("Optimizer steps completed (12 for a finished 12-step job).", "integer"),
        "stepsTotal": _num("Optimizer steps the job runs (spec.algorithm.steps).", "integer"),
        "progress": {"type": "string", "description": "stepsCompleted/stepsTotal, e.g. 12/12 (kubectl get rljobs)."},
        "progressPercentage": _num("stepsCompleted / stepsTotal in percent, 0-100.", "integer"),
        "estimatedRemainingSeconds": {
            "type": "integer",
            "nullable": True,
            "description": "Steps left x the last step's wall time; null before the first step and once ended.",
        },
        "trainerRestarts": _num(
            "Restarts after failures of the trainer rank that failed most (trainer.backoffLimit counts these).",
            "integer",
        ),
    }


def queueing_schema() -> dict[str, Any]:
    """Why a job is suspended (spec.suspend, Kueue) and its Kueue Workload."""
    text = lambda d: {"type": "string", "description": d}  # noqa: E731
    suspension = {
        "type": "object",
        "nullable": True,
        "description": "The last suspension: why, whether the trainer checkpointed first, when; null if never.",
        "properties": {
            "reason": text("Suspended (spec.suspend), WaitingForAdmission (Kueue) or Preempted (Kueue evicted it)."),
            "message": text("The reason in words."),
            "state": text("Suspending (the trainer is asked to checkpoint), Suspended or Resumed."),
            "requestedAt": text("When the suspension was decided (RFC 3339)."),
            "suspendedAt": text("When every child reached zero replicas (RFC 3339)."),
            "resumedAt": text("When the job was last resumed (RFC 3339)."),
            "checkpointedSteps": {
                "type": "integer",
                "nullable": True,
                "description": "Steps in the checkpoint the trainer wrote at the step boundary before it stopped "
                "(the job resumes there); null when no trainer ran or it did not answer.",
            },
        },
    }
    kueue = {
        "type": "object",
        "nullable": True,
        "description": "The job's Kueue Workload, when it carries the label kueue.x-k8s.io/queue-name.",
        "properties": {
            "workload": text("The Workload (kueue.x-k8s.io/v1beta2) the operator made for the job."),
            "queueName": text("Its LocalQueue (the label kueue.x-k8s.io/queue-name)."),
            "clusterQueue": text("The ClusterQueue that admitted it; empty while it waits."),
            "admitted": {"type": "boolean", "description": "Whether Kueue admits the job now."},
        },
    }
    return {"suspension": suspension, "kueue": kueue}


def printer_columns() -> list[dict[str, Any]]:
    col = lambda name, kind, path: {"name": name, "type": kind, "jsonPath": path}  # noqa: E731
    return [
        col("Phase", "string", ".status.phase"),
        col("Progress", "string", ".status.progress"),
        col("Reward", "number", ".status.rewardMean"),
        col("Reserved", "integer", ".status.workers.reserved"),
        col("Spot", "integer", ".status.workers.spot"),
        col("Tok/s", "number", ".status.tokensPerSecond"),
        col("$/h", "number", ".status.costPerHour"),
        col("Spent $", "number", ".status.costSoFar"),
        {**col("Queue", "string", ".metadata.labels.kueue\\.x-k8s\\.io/queue-name"), "priority": 1},
        col("Age", "date", ".metadata.creationTimestamp"),
    ]


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition manifest for rljobs.rlboost.io."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "rlboost"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": "rljob",
                "kind": KIND,
                "listKind": "RLJobList",
                "shortNames": ["rlj"],
                "categories": ["rlboost"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "An RL post-training job: trainer, rollout-manager, weight-server and "
                            "reserved + spot rollout workers.",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }
