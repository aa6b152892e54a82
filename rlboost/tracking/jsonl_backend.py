"""The `jsonl` tracking backend (the default): one JSON object per step in `<logging.dir>/metrics.jsonl`."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from rlboost.fsio import append_line
from rlboost.spec import LoggingSpec
from rlboost.tracking import make_dir

FILE_NAME = "metrics.jsonl"


class JsonlTracker:
    """Appends {"step", "time", <metric>: value, ...} lines; a resumed run appends to the same file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()  # writable now: a bad logging.dir fails the start, not a step

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # Opened per line (one a step): readable while the run goes on, and no handle is left open by a trainer
        # that fails before close().
        line = json.dumps({"step": step, "time": round(time.time(), 3), **metrics})
        append_line(self.path, line, "tracking (jsonl)", "logging.dir")  # whole or not at all

    def close(self) -> None:
        pass


def open_jsonl(spec: LoggingSpec, directory: Path, run_name: str) -> JsonlTracker:
    return JsonlTracker(make_dir(directory, "the jsonl backend") / FILE_NAME)
