"""`ensure_model`: reuse a model directory, or create the tiny policy there atomically ('huggingface' and 'uri'
models are downloaded by rlboost.models.fetch; 'pvc' is for Kubernetes only).

A model directory holds config.json, *.safetensors and the tokenizer files, as transformers writes
them. Creation writes into a temporary sibling directory and renames it into place, so concurrent
callers (trainer and workers starting together) never see a half-written model.

A created tiny model is also kept in a cache (`$RLBOOST_CACHE_DIR`, default `~/.cache/rlboost`; `off`
turns it off) under a key of everything it is a function of: its spec, the task's spec, the code that
builds it and the torch/transformers/tokenizers versions. The next run with the same key copies it
(milliseconds) instead of training the tokenizer and warming the model up again (10-20 s of a local run).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from rlboost.spec import ModelSpec, TaskSpec

log = logging.getLogger(__name__)
# The fields the tiny model's bits depend on (where it comes from or is written is not among them).
TINY_FIELDS = {"hidden_size", "num_layers", "num_heads", "warmup_steps", "seed"}


class ModelError(ValueError):
    """A model directory that cannot be used or created; the message names the spec field and the fix."""


def is_model_dir(path: Path) -> bool:
    """True when `path` holds a saved model: config.json and at least one *.safetensors file."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def ensure_model(model_spec: ModelSpec, task_spec: TaskSpec, path: str | Path) -> Path:
    """Return `path` holding a model, creating the tiny model there first when needed."""
    path = Path(path)
    if model_spec.source in ("huggingface", "uri"):  # reused only when fetched from the same source
        return _fetch(model_spec, task_spec, path)
    if is_model_dir(path):
        return path
    if model_spec.source == "pvc":
        raise ModelError(
            "model.source 'pvc' names a PersistentVolumeClaim, which only a Kubernetes job mounts; "
            "here use model.source 'path' with the model directory"
        )
    if model_spec.source == "path":
        raise ModelError(
            f"model.path {str(path)!r} holds no model (needs config.json and *.safetensors); "
            "point model.path at a Hugging Face model directory, or use model.source 'tiny'"
        )
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
    _copy_atomically(cached, path)
    log.info("tiny model copied from the cache %s to %s", cached, path)
    return path


def _fetch(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    """Download a 'huggingface' or 'uri' model into `path` (rlboost.models.fetch), as the init container would."""
    from rlboost.models.fetch import ModelFetchError, fetch_model, hf_token
    from rlboost.spec import JobSpec

    try:
        return fetch_model(JobSpec(model=model_spec, task=task_spec), path, hf_token(None))
    except ModelFetchError as err:
        raise ModelError(str(err)) from None


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


def _copy_atomically(source: Path, path: Path) -> None:
    fill_atomically(path, lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True))


def _create_atomically(model_spec: ModelSpec, task_spec: TaskSpec, path: Path) -> Path:
    from rlboost.models.tiny import create_tiny_model

    fill_atomically(path, lambda tmp: create_tiny_model(model_spec, task_spec, tmp))
    log.info("created tiny model at %s", path)
    return path


def fill_atomically(path: Path, fill: Callable[[Path], object]) -> None:
    """`fill` a temporary sibling of `path`, then rename it into place: no reader sees a half-written model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        fill(tmp)
        _rename_into_place(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _rename_into_place(tmp: Path, path: Path) -> None:
    if path.is_dir() and not any(path.iterdir()):
        path.rmdir()  # an empty placeholder; rename cannot replace it portably
    try:
        os.rename(tmp, path)
    except OSError:
        if not is_model_dir(path):
            raise
        log.info("model created concurrently at %s; using it", path)  # the same model: the race is harmless
