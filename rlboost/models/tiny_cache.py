"""The tiny policy made ready at a path: reused when there, else copied from the cache, else created.

A created tiny model is also kept in a cache (`$RLBOOST_CACHE_DIR`, default `~/.cache/rlboost`; `off`
turns it off) under a key of everything it is a function of: its spec, the task's spec, the code that
builds it and the torch/transformers/tokenizers versions. The next run with the same key copies it
(milliseconds) instead of training the tokenizer and warming the model up again (10-20 s of a local run).
Creation and copies land atomically (rlboost.models.atomic).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path

from rlboost.models.atomic import fill_atomically
from rlboost.models.errors import ModelError
from rlboost.models.layout import is_model_dir
from rlboost.models.tiny import create_tiny_model
from rlboost.spec import ModelSpec, TaskSpec

log = logging.getLogger(__name__)
# The fields the tiny model's bits depend on (where it comes from or is written is not among them).
TINY_FIELDS = {"hidden_size", "num_layers", "num_heads", "warmup_steps", "seed"}


def ensure_tiny_model(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    """Return `path` holding the tiny model of these specs: as found, copied from the cache, or created."""
    if is_model_dir(path):
        return path
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ModelError(f"model.path {str(path)!r} exists but is not a model directory; choose an empty or new path")
    cached = cached_model_dir(model_spec, task_spec)
    if cached is None:
        return _create_atomically(model_spec, task_spec, path)
    try:
        if not is_model_dir(cached):
            _create_atomically(model_spec, task_spec, cached)
    except OSError as err:  # a read-only home, a full disk: the cache is a convenience, not a requirement
        log.warning("model cache %s is not usable (%s); creating the model in place", cached.parent, err)
        return _create_atomically(model_spec, task_spec, path)
    fill_atomically(path, lambda tmp: shutil.copytree(cached, tmp, dirs_exist_ok=True))
    log.info("tiny model copied from the cache %s to %s", cached, path)
    return path


def cache_root() -> Path | None:
    """The model cache's directory, or None when RLBOOST_CACHE_DIR is 'off'."""
    configured = os.environ.get("RLBOOST_CACHE_DIR", "")
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlboost"


def cached_model_dir(model_spec: ModelSpec, task_spec: TaskSpec) -> Path | None:
    """Where the cache keeps the tiny model of these specs (it may not exist yet); None if the cache is off."""
    root = cache_root()
    if root is None:
        return None
    return root / "models" / f"tiny-{model_key(model_spec, task_spec)}"


def model_key(model_spec: ModelSpec, task_spec: TaskSpec) -> str:
    """A hash of everything the tiny model's bits depend on (where it is written is not among them)."""
    here = Path(__file__).resolve().parent
    sources = [here / "tiny.py", here / "tokenizer.py", *sorted((here.parent / "tasks").glob("*.py"))]
    sources += sorted((here.parent / "environments").glob("*.py"))  # demonstrated episodes (task.environment)
    parts = {
        "model": model_spec.model_dump(include=TINY_FIELDS),
        "task": task_spec.model_dump(),
        "code": [hashlib.sha256(f.read_bytes()).hexdigest() for f in sources],
        "versions": [_version(d) for d in ("torch", "transformers", "tokenizers")],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # a build without distribution metadata (e.g. torch from source)
        return "unknown"


def _create_atomically(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    fill_atomically(path, lambda tmp: create_tiny_model(model_spec, task_spec, tmp))
    log.info("created tiny model at %s", path)
    return path
