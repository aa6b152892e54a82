"""A model directory filled atomically: a temporary sibling is filled, then renamed into place, so concurrent
callers (trainer and workers starting together, a restarted init container) never see a half-written model.
Both the tiny model's creation and the fetcher's downloads land this way."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from rlboost.models.layout import is_model_dir

log = logging.getLogger(__name__)


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
