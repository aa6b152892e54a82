"""Durable file-system steps shared by the services that write state to disk (trainer checkpoints, weight-server
versions, the run directory, dumps, tracking, export): what makes a rename survive a crash, and what a failed
write says and leaves behind.

Every writer fails the same way (issue 31 item 2): `WriteFailed`, one line naming what was written, the path, why
(`no space left on device` when the file system is full, else the OS's reason) and the spec field or flag that
chose the place, with nothing partial left behind (the writer's `undo`: a temporary directory removed, an
appended line cut off again).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_SAYS_FULL = re.compile(r"No space left on device|StorageFull|Disk quota exceeded")
_FULL_BELOW = 1 << 20  # a file system with less than this free (or 1/50 of its size, if smaller) after a write
_FULL_BELOW_MIN = 64 << 10  # failed is full, even where the library's error lost the errno (torch's zip writer)


class WriteFailed(RuntimeError):  # noqa: N818 (what the user reads: "checkpoint ... could not be written")
    """A write that did not happen, as one line: what, where, why, the field or flag that chose the place."""

    def __init__(self, what: str, path: Path | str, why: str, field: str, full: bool) -> None:
        fix = f"free space there or change {field}" if full else f"check {field}"
        super().__init__(f"{what} could not be written to {path}: {why}; {fix} (nothing partial was left)")
        self.path, self.field, self.full = Path(path), field, full


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__  # type: ignore[assignment]


def _statvfs(path: Path | str) -> os.statvfs_result | None:
    """The file system of `path` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return os.statvfs(p)
    except OSError:
        return None


def free_bytes(path: Path | str) -> int | None:
    """Bytes free to an unprivileged writer on the file system of `path`."""
    st = _statvfs(path)
    return None if st is None else st.f_bavail * st.f_frsize


def is_disk_full(err: BaseException, path: Path | str | None = None) -> bool:
    """The write failed for want of space: ENOSPC/EDQUOT anywhere in the error's chain, or (a library that lost
    the errno) the file system of `path` is nearly full now."""
    if any(isinstance(e, OSError) and e.errno in NO_SPACE for e in _chain(err)):
        return True
    if any(_SAYS_FULL.search(str(e)) for e in _chain(err)):  # a library's own error (safetensors: StorageFull)
        return True
    st = _statvfs(path) if path is not None else None
    if st is None:
        return False
    limit = min(_FULL_BELOW, max(_FULL_BELOW_MIN, st.f_blocks * st.f_frsize // 50))
    return st.f_bavail * st.f_frsize < limit


def reason(err: BaseException, path: Path | str | None = None) -> str:
    """Why a write failed, in words: 'no space left on device', or the OS's reason."""
    if is_disk_full(err, path):
        return "no space left on device"
    os_err = next((e for e in _chain(err) if isinstance(e, OSError)), None)
    return (os_err.strerror or str(os_err)) if os_err is not None else f"{type(err).__name__}: {err}"


@contextlib.contextmanager
def writing(what: str, path: Path | str, field: str, undo: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a write; an OSError (or a library's error while the disk is full) becomes WriteFailed after `undo`."""
    try:
        yield
    except WriteFailed:
        raise
    except Exception as err:
        full = is_disk_full(err, path)  # before the undo frees what the failed write took
        if not isinstance(err, OSError) and not full:
            raise  # not a failed write: the caller's own bug, as it was
        why = "no space left on device" if full else reason(err)
        if undo is not None:
            with contextlib.suppress(OSError):
                undo()
        raise WriteFailed(what, path, why, field, full) from err


def append_line(path: Path, line: str, what: str, field: str) -> None:
    """Append `line` (with its newline) whole or not at all: a failed write is cut off again (WriteFailed)."""
    data = memoryview((line + "\n").encode())
    with writing(what, path, field):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        with writing(what, path, field, undo=lambda: os.ftruncate(fd, start)):
            while data:
                data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the entries renamed into it (a new checkpoint, a committed version) are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str, what: str = "", field: str = "") -> None:
    """`path` holds `text` whole or not at all: a reader (or a resumed process) never sees half of it. A failed
    write leaves no temporary file (WriteFailed when `what` names the write, else the OSError)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if not what:
            raise
        raise WriteFailed(what, path, reason(err, path), field, is_disk_full(err, path)) from err
