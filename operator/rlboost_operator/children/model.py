"""The model (spec.model) in a pod: its volume and mount, and the `fetch-model` init container that makes it ready.

The trainer and the reserved workers get the model before they start, from an init container `fetch-model` that
runs `python -m rlboost.models.fetch` (its flags rendered from rlboost.options.ModelFetchOptions) into an emptyDir
mounted at /models (the model at /models/policy); a 'pvc' model is the claim itself, mounted read-only at
/models/policy, and the init container only checks it. A failing fetch writes one line naming spec.model's field
to its termination message, which the operator copies into the RLJob's status (model_source.py). Spot workers get
no model: they pull config, tokenizer and weights from the weight-server (a new spot VM never touches the model
store).
"""

from __future__ import annotations

from typing import Any

from rlboost.options import ModelFetchOptions
from rlboost.spec import ModelSpec, ResourcesSpec
from rlboost_operator.children.naming import CONFIG_PATH, MODEL_DIR, MODEL_ROOT, image
from rlboost_operator.children.pod import env_var, job_mounts, resources, scratch_env, security
from rlboost_operator.config import OperatorSettings

FETCH_CONTAINER = "fetch-model"  # the init container that makes the model ready (the operator watches it)
TERMINATION_LOG = "/dev/termination-log"


def model_dir(model: ModelSpec) -> str:
    """Where the trainer's and reserved workers' model directory is in their pods."""
    return f"{MODEL_DIR}/{model.path.strip('/')}" if model.source == "pvc" and model.path.strip("/") else MODEL_DIR


def model_volume(model: ModelSpec) -> dict[str, Any]:
    if model.source == "pvc":
        return {"name": "model", "persistentVolumeClaim": {"claimName": model.claim_name, "readOnly": True}}
    return {"name": "model", "emptyDir": {}}


def model_mount(model: ModelSpec) -> dict[str, Any]:
    if model.source == "pvc":
        return {"name": "model", "mountPath": MODEL_DIR, "readOnly": True}
    return {"name": "model", "mountPath": MODEL_ROOT}  # the fetcher renames /models/policy into place inside it


def fetch_model_container(
    model: ModelSpec, settings: OperatorSettings, image_key: str, requests: ResourcesSpec
) -> dict[str, Any]:
    """The init container that fetches (or, for 'pvc', checks) the model before the pod's service starts; in the
    service's own image, which holds rlboost.models. Its error line becomes its termination message."""
    env = [env_var("RLBOOST_CACHE_DIR", "off"), env_var("HF_HUB_DISABLE_TELEMETRY", "1"), *scratch_env()]
    if model.source == "huggingface" and model.token_secret:
        ref = {"name": model.token_secret, "key": "token"}
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}})
    # its flags from the fetcher's options model; the Hugging Face token comes as $HF_TOKEN, not a token file
    options = ModelFetchOptions(config=CONFIG_PATH, dest=model_dir(model), termination_log=TERMINATION_LOG)
    return {
        "name": FETCH_CONTAINER,
        "image": image(settings, image_key),
        "imagePullPolicy": settings.image_pull_policy,
        "command": options.command(),
        "env": env,
        "resources": resources(0, requests),  # a download (or, for 'tiny', a CPU warm-up): no accelerator
        "securityContext": security(),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [*job_mounts(), model_mount(model)],
    }
