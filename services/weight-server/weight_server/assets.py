"""The model's assets on disk: `<data-dir>/assets/<name>`, the non-weight files of the model directory.

config.json, generation_config.json, the tokenizer files and the chat template: what a worker needs besides the
weights to build its engine, so a spot worker needs only the weight-server's address. The trainer uploads them
(bearer token) before its first version; workers list them (GET /v1/assets) and fetch each (GET /v1/assets/{n}).

An asset is immutable: the same bytes again are accepted (a restarted trainer uploads them again), other bytes
refused. A put writes a temporary file, fsyncs it and renames it into place, so a crash never leaves half an
asset visible; leftovers of interrupted puts are removed on start, and the sha256 of every asset is recomputed
(they are small). What may be held is bounded (`admit`, pure): a plain file name, MAX_ASSET_BYTES each,
MAX_ASSETS and MAX_ASSETS_TOTAL_BYTES in all.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

from rlboost.fsio import fsync_dir
from rlboost.wire.weights_io import (
    ASSET_NAME_PATTERN,
    MAX_ASSET_BYTES,
    MAX_ASSETS,
    MAX_ASSETS_TOTAL_BYTES,
    AssetInfo,
    AssetList,
)

from .errors import ErrorKind, StoreError, storing

INCOMING_PREFIX = ".incoming-"
_NAME = re.compile(ASSET_NAME_PATTERN)


def check_name(name: str) -> None:
    if not _NAME.match(name) or name.startswith(INCOMING_PREFIX):
        raise StoreError(
            ErrorKind.INVALID, f"asset name {name!r} must be a plain file name (letters, digits, '.', '_', '-')", "name"
        )


def admit(held: Mapping[str, AssetInfo], name: str, size: int) -> None:
    """Whether an asset of `size` bytes named `name` may be added (or replace itself with the same bytes)."""
    check_name(name)
    if size > MAX_ASSET_BYTES:
        raise StoreError(
            ErrorKind.TOO_LARGE, f"asset {name!r} is {size} bytes; at most {MAX_ASSET_BYTES} are held", "Content-Length"
        )
    others = {n: a for n, a in held.items() if n != name}
    if len(others) + 1 > MAX_ASSETS:
        raise StoreError(
            ErrorKind.TOO_LARGE, f"at most {MAX_ASSETS} assets are held; {name!r} would be one more", "name"
        )
    total = sum(a.size for a in others.values()) + size
    if total > MAX_ASSETS_TOTAL_BYTES:
        raise StoreError(
            ErrorKind.TOO_LARGE, f"assets would total {total} bytes; at most {MAX_ASSETS_TOTAL_BYTES} are held", "name"
        )


def check_same(held: AssetInfo | None, new: AssetInfo) -> bool:
    """True when the asset is held with these bytes already; a StoreError when with other bytes."""
    if held is None:
        return False
    if held.sha256 != new.sha256:
        raise StoreError(
            ErrorKind.CONFLICT,
            f"asset {new.name!r} is held with other bytes (sha256 {held.sha256[:12]}...); assets are immutable",
            "name",
        )
    return True


class AssetStore:
    """The assets held on disk, with their sizes and sha256s in memory. Thread-safe."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._held: dict[str, AssetInfo] = {}
        for path in sorted(self.root.iterdir()):
            if path.name.startswith(INCOMING_PREFIX):
                path.unlink(missing_ok=True)  # an interrupted put
            elif path.is_file() and _NAME.match(path.name):
                data = path.read_bytes()
                self._held[path.name] = AssetInfo(name=path.name, size=len(data), sha256=_sha256(data))

    def list(self) -> AssetList:
        with self._lock:
            return AssetList(assets=[self._held[n] for n in sorted(self._held)])

    def info(self, name: str) -> AssetInfo:
        check_name(name)
        with self._lock:
            found = self._held.get(name)
        if found is None:
            raise StoreError(ErrorKind.NOT_FOUND, f"asset {name!r} is not held (see GET /v1/assets)", "name")
        return found

    def path(self, name: str) -> Path:
        return self.root / self.info(name).name

    def admit(self, name: str, size: int) -> None:
        """Refuse an upload before its bytes are read (its declared size)."""
        with self._lock:
            admit(self._held, name, size)

    def put(self, name: str, data: bytes) -> AssetInfo:
        """Hold `data` as asset `name`: written, fsynced and renamed into place; blocking (call off the loop)."""
        new = AssetInfo(name=name, size=len(data), sha256=_sha256(data))
        with self._lock:
            admit(self._held, name, len(data))
            if check_same(self._held.get(name), new):
                return new
        tmp = self.root / f"{INCOMING_PREFIX}{uuid.uuid4().hex}"
        try:
            with storing(f"asset {name!r}", self.root), open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            with self._lock:  # checked again: another put of the same name may have won meanwhile
                admit(self._held, name, len(data))
                if check_same(self._held.get(name), new):
                    return new
                os.rename(tmp, self.root / name)
                self._held[name] = new
            fsync_dir(self.root)
        finally:
            tmp.unlink(missing_ok=True)
        return new

    def bytes_held(self) -> int:
        with self._lock:
            return sum(a.size for a in self._held.values())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
