"""The `mlflow` tracking backend: a run in experiment `logging.project` of `logging.mlflowTrackingUri`
(a tracking server, http(s)://, checked before the first step) or a file store (default `<logging.dir>/mlruns`).
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlboost.spec import LoggingSpec
from rlboost.tracking import TrackingError, finite, make_dir, missing_library

SUBDIR = "mlruns"
PROBE_TIMEOUT_S = 5.0
BATCH = 1000  # MLflow's limit of metrics per log_batch call


class MlflowTracker:
    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, step) for name, value in finite(metrics).items()]  # MLflow refuses NaN
        for i in range(0, len(batch), BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def tracking_uri(spec: LoggingSpec, directory: Path) -> str:
    """`logging.mlflowTrackingUri`, or a file store under the tracking directory."""
    return spec.mlflow_tracking_uri or (make_dir(directory / SUBDIR, "the mlflow backend")).resolve().as_uri()


def probe_server(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """A tracking server must answer its /health before the first step (the client alone retries for minutes)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as reply:
            reply.read(64)
    except urllib.error.HTTPError:
        return  # it answered: a server behind a proxy may not route /health, the run's calls will tell
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingError(
            f"logging.backends includes 'mlflow' but the tracking server logging.mlflowTrackingUri {uri!r} does not "
            f"answer ({reason}): start it or fix the URI, leave logging.mlflowTrackingUri empty for a file store in "
            "logging.dir, or remove 'mlflow' from logging.backends"
        ) from None


def open_mlflow(spec: LoggingSpec, directory: Path, run_name: str) -> MlflowTracker:
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as err:
        raise missing_library("mlflow", err) from None
    uri = tracking_uri(spec, directory)
    if uri.startswith(("http://", "https://")):
        probe_server(uri)
    if uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked for it: the spec asked for it
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(spec.project)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(spec.project)
    run = client.create_run(experiment_id, run_name=run_name)
    return MlflowTracker(client, run.info.run_id)
