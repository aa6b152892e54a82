"""`ensure_model`: reuse a model directory, or create the tiny policy there atomically.

A model directory holds config.json, *.safetensors and the tokenizer files, as transformers writes
them. Creation writes into a temporary sibling directory and renames it into place, so concurrent
callers (trainer and workers starting together) never see a half-written model.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from rlboost.spec import ModelSpec, TaskSpec

log = logging.getLogger(__name__)


class ModelError(ValueError):
    """A model directory that cannot be used or created; the message names the spec field and the fix."""


def is_model_dir(path: Path) -> bool:
    """True when `path` holds a saved model: config.json and at least one *.safetensors file."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def ensure_model(model_spec: ModelSpec, task_spec: TaskSpec, path: str | Path) -> Path:
    """Return `path` holding a model, creating the tiny model there first when needed."""
    path = Path(path)
    if is_model_dir(path):
        return path
    if model_spec.source == "path":
        raise ModelError(
            f"model.path {str(path)!r} holds no model (needs config.json and *.safetensors); "
            "point model.path at a Hugging Face model directory, or use model.source 'tiny'"
        )
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ModelError(f"model.path {str(path)!r} exists but is not a model directory; choose an empty or new path")
    return _create_atomically(model_spec, task_spec, path)


def _create_atomically(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    from rlboost.models.tiny import create_tiny_model

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        create_tiny_model(model_spec, task_spec, tmp)
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()  # an empty placeholder; rename cannot replace it portably
        try:
            os.rename(tmp, path)
        except OSError:
            if is_model_dir(path):  # another process won the race with an identical model
                log.info("model created concurrently at %s; using it", path)
                return path
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("created tiny model at %s", path)
    return path
