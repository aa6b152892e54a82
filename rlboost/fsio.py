"""Durable file-system steps shared by the services that write state to disk (trainer checkpoints,
weight-server versions): what makes a rename survive a crash."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the entries renamed into it (a new checkpoint, a committed version) are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """`path` holds `text` whole or not at all: a reader (or a resumed process) never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
