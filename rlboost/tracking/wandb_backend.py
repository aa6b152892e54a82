"""The `wandb` tracking backend: a W&B run under `<logging.dir>/wandb`.

W&B's own environment decides where it goes: WANDB_MODE=offline writes the run to disk only (upload it
later with `wandb sync`), otherwise WANDB_API_KEY (and WANDB_BASE_URL for a self-hosted server) are read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlboost.spec import LoggingSpec
from rlboost.tracking import TrackingError, make_dir, missing_library

SUBDIR = "wandb"
OFFLINE_MODES = ("offline", "dryrun", "disabled")


class WandbTracker:
    def __init__(self, run: Any) -> None:
        self.run = run

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


def _has_credentials() -> bool:
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return bool(os.environ.get("WANDB_API_KEY")) or (netrc.is_file() and "api.wandb.ai" in netrc.read_text())


def check_credentials() -> str:
    """W&B's mode (WANDB_MODE, default online); online needs credentials (a TrackingError otherwise)."""
    mode = os.environ.get("WANDB_MODE", "online")
    if mode not in OFFLINE_MODES and not _has_credentials():
        raise TrackingError(
            "logging.backends includes 'wandb' but W&B has no credentials: set WANDB_API_KEY in the trainer's "
            "environment, or WANDB_MODE=offline to write the run to logging.dir only, or remove 'wandb' from "
            "logging.backends"
        )
    return mode


def open_wandb(spec: LoggingSpec, directory: Path, run_name: str) -> WandbTracker:
    try:
        import wandb
    except ImportError as err:
        raise missing_library("wandb", err) from None
    mode = check_credentials()
    root = make_dir(directory, "the wandb backend")
    try:
        run = wandb.init(project=spec.project, name=run_name, dir=str(root), mode=mode, reinit="create_new")
    except Exception as err:  # noqa: BLE001 (wandb raises its own types: any of them means no run)
        raise TrackingError(
            f"logging.backends includes 'wandb' but W&B could not start a run ({type(err).__name__}: {err}); check "
            "WANDB_API_KEY / WANDB_BASE_URL, set WANDB_MODE=offline, or remove 'wandb' from logging.backends"
        ) from None
    return WandbTracker(run)
