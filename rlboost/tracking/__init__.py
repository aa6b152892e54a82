"""Metrics tracking (`spec.logging`): each step's numeric metrics to JSONL, TensorBoard, W&B and/or MLflow.

    trackers = open_trackers(spec.logging, run_dir, job="local")   # checks every backend first: TrackingError
    trackers.log(step, step_metrics(report))                        # every numeric field, nested ones as a/b
    trackers.close()

A backend is a `Tracker` (log, close) in a module of its own that imports its library only when opened, so
a missing library or an unreachable server is a TrackingError naming `spec.logging.backends` and the fix
before the first step, and importing this package costs nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from rlboost.spec import LoggingSpec

log = logging.getLogger(__name__)

# backend name -> "module:function" opening it; the function takes (spec, directory, run name) -> Tracker.
BACKENDS = {
    "jsonl": "rlboost.tracking.jsonl_backend:open_jsonl",
    "tensorboard": "rlboost.tracking.tensorboard_backend:open_tensorboard",
    "wandb": "rlboost.tracking.wandb_backend:open_wandb",
    "mlflow": "rlboost.tracking.mlflow_backend:open_mlflow",
}
# The pip package that provides each backend's library (the fix a missing import names).
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow-skinny"}


class TrackingError(ValueError):
    """A tracking backend that cannot be used; the message names spec.logging's field and the fix."""


class Tracker(Protocol):
    """One backend: `log` one step's metrics (name -> number), `close` flushes and ends the run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


IMPORTS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}  # backend -> module it imports


def missing_library(backend: str, err: ImportError | str) -> TrackingError:
    """The error for a backend whose library is not installed."""
    return TrackingError(
        f"logging.backends includes '{backend}' but its library cannot be imported ({err}): install it in the "
        f"trainer's environment (pip install '{PACKAGES[backend]}', or 'rlboost[tracking]') or remove '{backend}' "
        "from logging.backends"
    )


def tracking_dir(spec: LoggingSpec, run_dir: Path) -> Path:
    """`logging.dir`, resolved: empty = <run dir>/tracking, relative = under the run dir."""
    if not spec.dir:
        return run_dir / "tracking"
    path = Path(spec.dir).expanduser()
    return path if path.is_absolute() else run_dir / path


def step_metrics(report: BaseModel | Mapping[str, Any]) -> dict[str, float]:
    """Every numeric field of a step report (nested models and dicts as 'outer/inner'), without `step`;
    booleans and strings are left out, so fields added to the report later are logged with no change here."""
    data = report.model_dump() if isinstance(report, BaseModel) else dict(report)
    data.pop("step", None)
    return dict(_flatten(data, ""))


def _flatten(data: Mapping[str, Any], prefix: str):
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            yield name, float(value)
        elif isinstance(value, BaseModel):
            yield from _flatten(value.model_dump(), f"{name}/")
        elif isinstance(value, Mapping):
            yield from _flatten(value, f"{name}/")


class Trackers:
    """The job's backends together: one failing backend's log is reported once, not fatal to training; a full
    disk is said as one line naming `logging.dir`'s directory (rlboost.fsio.WriteFailed)."""

    def __init__(self, trackers: dict[str, Tracker], directory: Path | None = None) -> None:
        self.trackers, self.directory = trackers, directory
        self._failed: set[str] = set()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, tracker in self.trackers.items():
            try:
                tracker.log(step, metrics)
            except Exception as err:  # noqa: BLE001 (a metrics sink must not end the training run)
                if name not in self._failed:
                    log.warning(
                        "tracking backend failed to log", extra={"backend": name, "error": self._why(name, err)}
                    )
                self._failed.add(name)

    def _why(self, name: str, err: Exception) -> str:
        from rlboost.fsio import WriteFailed, is_disk_full

        if isinstance(err, WriteFailed) or self.directory is None or not is_disk_full(err, self.directory):
            return str(err)
        return str(WriteFailed(f"tracking ({name})", self.directory, "no space left on device", "logging.dir", True))

    def close(self) -> None:
        for name, tracker in self.trackers.items():
            try:
                tracker.close()
            except Exception as err:  # noqa: BLE001 (closing the others still matters)
                log.warning("tracking backend failed to close", extra={"backend": name, "error": str(err)})


def open_trackers(spec: LoggingSpec, run_dir: Path, job: str = "local") -> Trackers:
    """Open every backend of `spec.backends` (each checks its library, directory or server first); on a
    TrackingError the ones already opened are closed again."""
    directory = tracking_dir(spec, run_dir)
    run_name = spec.run_name or job
    opened: dict[str, Tracker] = {}
    try:
        for name in spec.backends:
            opened[name] = _opener(name)(spec, directory, run_name)
    except BaseException:
        Trackers(opened).close()
        raise
    log.info("tracking", extra={"backends": list(opened), "dir": str(directory)})
    return Trackers(opened, directory)


def check_backends(spec: LoggingSpec) -> None:
    """What opening would refuse, without starting a run (`rlboost local` before any process starts): each
    backend's library is installed, W&B has credentials or runs offline, an MLflow server answers."""
    from rlboost.tracking.mlflow_backend import probe_server
    from rlboost.tracking.wandb_backend import check_credentials

    for name in spec.backends:
        module = IMPORTS.get(name)
        if module and not _installed(module):
            raise missing_library(name, f"no module named {module!r}")
    if "wandb" in spec.backends:
        check_credentials()
    if "mlflow" in spec.backends and spec.mlflow_tracking_uri.startswith(("http://", "https://")):
        probe_server(spec.mlflow_tracking_uri)


def _installed(module: str) -> bool:
    if module in sys.modules:  # imported already (None: an import of it is known to fail)
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def _opener(name: str) -> Callable[[LoggingSpec, Path, str], Tracker]:
    module, function = BACKENDS[name].split(":")
    return getattr(importlib.import_module(module), function)


def finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """The metrics with a finite value (backends that refuse NaN or infinity get these)."""
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def make_dir(directory: Path, what: str) -> Path:
    """Create a backend's directory, or a TrackingError naming logging.dir."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrackingError(
            f"logging.dir: cannot create {directory} for {what} ({err.strerror or err}); choose a writable directory"
        ) from None
    return directory
