"""A real small file system for full-disk tests (issue 31 item 2): a tmpfs with `size=`, mounted under
/tmp/reliability/ and unmounted in teardown. Writers run against the kernel's own ENOSPC, not a mock.

    with mounted_tmpfs("1m") as root:   # a fresh 1 MiB file system
        ...

Skipped, saying why, where mounting is not permitted (not root, or a container without CAP_SYS_ADMIN).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BASE = Path("/tmp/reliability")


@contextlib.contextmanager
def mounted_tmpfs(size: str) -> Iterator[Path]:
    """A fresh tmpfs of `size` ('1m', '64k'); pytest.skip when it cannot be mounted here."""
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs and needs root")
    root = BASE / uuid.uuid4().hex[:12]
    root.mkdir(parents=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)], capture_output=True)
    if done.returncode != 0:
        root.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or done.returncode})")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        shutil.rmtree(root, ignore_errors=True)


def fill(root: Path, leave: int = 0) -> Path:
    """Fill the file system of `root` until at most `leave` bytes are free; returns the filler file."""
    filler = root / f"filler-{uuid.uuid4().hex[:6]}"
    free = shutil.disk_usage(root).free
    with open(filler, "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave))
    return filler
