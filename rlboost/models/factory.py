"""`ensure_model`: a model directory made ready for a local run, whatever `spec.model.source` says: the tiny
policy created (or reused, rlboost.models.tiny_cache), a 'huggingface' or 'uri' model downloaded as the init
container would (rlboost.models.sources), a 'path' directory checked; 'pvc' is for Kubernetes only.

A model directory holds config.json, *.safetensors and the tokenizer files, as transformers writes
them. Creation and downloads write into a temporary sibling directory and rename it into place, so concurrent
callers (trainer and workers starting together) never see a half-written model.
"""

from __future__ import annotations

from pathlib import Path

from rlboost.models.errors import ModelError, ModelFetchError
from rlboost.models.layout import is_model_dir
from rlboost.models.sources import fetch_model, hf_token
from rlboost.models.tiny_cache import ensure_tiny_model
from rlboost.spec import JobSpec, ModelSpec, TaskSpec


def ensure_model(model_spec: ModelSpec, task_spec: TaskSpec, path: str | Path) -> Path:
    """Return `path` holding a model, creating the tiny model there first when needed."""
    path = Path(path)
    if model_spec.source in ("huggingface", "uri"):  # reused only when fetched from the same source
        return _fetch(model_spec, task_spec, path)
    if model_spec.source in ("path", "pvc"):
        return _existing(model_spec, path)
    return ensure_tiny_model(model_spec, task_spec, path)


def _existing(model_spec: ModelSpec, path: Path) -> Path:
    """A 'path' or 'pvc' model: used where it is, never created."""
    if is_model_dir(path):
        return path
    if model_spec.source == "pvc":
        raise ModelError(
            "model.source 'pvc' names a PersistentVolumeClaim, which only a Kubernetes job mounts; "
            "here use model.source 'path' with the model directory"
        )
    raise ModelError(
        f"model.path {str(path)!r} holds no model (needs config.json and *.safetensors); "
        "point model.path at a Hugging Face model directory, or use model.source 'tiny'"
    )


def _fetch(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    """Download a 'huggingface' or 'uri' model into `path` (rlboost.models.sources), as the init container would."""
    try:
        return fetch_model(JobSpec(model=model_spec, task=task_spec), path, hf_token(None))
    except ModelFetchError as err:
        raise ModelError(str(err)) from None
