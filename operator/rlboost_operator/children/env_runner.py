"""The env-runner Deployment (agentic episodes; only for a job with task.environment): CPU pods that run the job's
environment and drive its episodes through the rollout-manager, on spot nodes where rollout.envRunners.spot
allows (a pod lost there costs its episodes a restart from their tasks, never a token of a turn). The model's
tokenizer and chat template come from the weight-server (signed by the trainer), so the pods carry no model.
"""

from __future__ import annotations

from typing import Any

from rlboost.options import env_runner_options
from rlboost.spec import EnvRunnersSpec, JobSpec
from rlboost_operator import spot
from rlboost_operator.children.naming import METRICS_PORT, image, labels, names, selector, site
from rlboost_operator.children.pod import (
    deployment,
    field_env,
    job_mounts,
    job_volumes,
    pod_spec,
    probe,
    resources,
    scratch_env,
    security,
)
from rlboost_operator.config import OperatorSettings

STARTUP_TIMEOUT_S = 1800.0  # the tokenizer comes with the trainer's first weight version


def _scheduling(pool: EnvRunnersSpec) -> dict[str, Any]:
    """'required': spot nodes only; 'allowed': spot taints tolerated and spot nodes preferred; 'never': off them."""
    if pool.spot == "never":
        return {"nodeSelector": dict(pool.node_selector), "affinity": spot.off_spot_affinity()}
    tolerations = [{"key": k, "operator": "Exists", "effect": "NoSchedule"} for k, _ in spot.SPOT_LABELS.values()]
    terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in spot.SPOT_LABELS.values()]
    if pool.spot == "required":
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    else:
        preferred = [{"weight": 100, "preference": term} for term in terms]
        affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    return {"nodeSelector": dict(pool.node_selector), "tolerations": tolerations, "affinity": affinity}


def env_runners(job: str, namespace: str, spec: JobSpec, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The env-runner Deployment, or nothing for a job without task.environment."""
    if not spec.task.episodes:
        return []
    pool = spec.rollout.env_runners
    n, lbl, sel = names(job)["env_runners"], labels(job, "env-runner"), selector(job, "env-runner")
    options = env_runner_options(site(job, namespace, settings), "$(POD_NAME)", "$(NODE_NAME)", "", METRICS_PORT)
    options = options.model_copy(update={"startup_timeout": STARTUP_TIMEOUT_S})
    container = {
        "name": "env-runner",
        "image": image(settings, "env_runner"),
        "imagePullPolicy": settings.image_pull_policy,
        "command": options.command(),
        "env": [field_env("POD_NAME", "metadata.name"), field_env("NODE_NAME", "spec.nodeName"), *scratch_env()],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "readinessProbe": probe("metrics"),
        "livenessProbe": probe("metrics"),
        "resources": resources(0, pool.resources),
        "securityContext": security(),
        "volumeMounts": job_mounts(),
    }
    extra = {**_scheduling(pool), "terminationGracePeriodSeconds": 25}  # the drain: running episodes finish
    pod = pod_spec([container], job_volumes(job, "env-runner"), extra)
    return [deployment(n, namespace, lbl, sel, pool.replicas, pod)]
