"""The `tensorboard` tracking backend: scalar summaries in event files under `<logging.dir>/tensorboard`.

Written with tensorboard's own event writer (no TensorFlow, no torch): `tensorboard --logdir <logging.dir>`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlboost.spec import LoggingSpec
from rlboost.tracking import make_dir, missing_library

SUBDIR = "tensorboard"


class TensorBoardTracker:
    """One scalar per metric and step (tag = the metric's name)."""

    def __init__(self, directory: Path) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as err:
            raise missing_library("tensorboard", err) from None
        self._event, self._summary = Event, Summary
        self._writer: Any = EventFileWriter(str(directory))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=name, simple_value=value) for name, value in metrics.items()]
        self._writer.add_event(self._event(step=step, wall_time=time.time(), summary=self._summary(value=values)))
        self._writer.flush()  # each step visible to a running TensorBoard

    def close(self) -> None:
        self._writer.close()


def open_tensorboard(spec: LoggingSpec, directory: Path, run_name: str) -> TensorBoardTracker:
    return TensorBoardTracker(make_dir(directory / SUBDIR, "the tensorboard backend"))
