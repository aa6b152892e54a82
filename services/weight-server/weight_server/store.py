"""Weight versions on disk: `<data-dir>/versions/<v>/payload` + `manifest.json`.

An upload streams into `<data-dir>/incoming/<random>/` while its whole and per-chunk sha256 are
computed on the fly; on commit the files are fsynced and the directory is renamed into
`versions/<v>` (atomic on one filesystem), so a crash never leaves a half-written version visible.
On start the store reloads every complete version and clears leftovers of interrupted uploads.

Companions: a version may hold two payloads, a full snapshot and the delta from an earlier version
(the trainer uploads both at each periodic snapshot version, delta first). The first upload of a version
is its primary payload (`versions/<v>/payload`); a second PUT of the other kind with the same checksum is
a companion, installed atomically under `versions/<v>/<kind>/` and listed with `companion=True`. So a
worker one version behind a snapshot version pulls the small delta, and a new worker the snapshot.

Retention keeps the newest `retain_versions` versions plus every version that a retained delta
chains back to (its bases, down to the nearest version that holds a full snapshot, primary or
companion), so every retained version stays reachable from nothing. A version's payloads, companion
included, go together. A kept delta whose base has expired still serves a worker that holds that base.

Compacted deltas: `compacted(a, b)` composes the stored chain a->...->b into one delta
(rlboost.delta.compose_chain, torch-free) and caches it under `<data-dir>/compacted/<a>-<b>/`
(same payload + manifest layout, installed atomically); it is dropped once a or b leaves the store.
A sync plan for a worker at a serves the fewest bytes of: the chain, the compacted a->b delta,
the full snapshot + its deltas, or the full snapshot + the compacted delta after it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlboost.wire.weights_io import ChunkInfo, Manifest

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PAYLOAD = "payload"
READ_BLOCK = 1 << 20


class StoreError(Exception):
    """A request the store refuses: HTTP `status`, a message and the offending field."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_HASHERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="upload-sha256")  # uploads' whole-payload hashes


@dataclass
class Upload:
    """One upload in progress: bytes stream to a temporary payload file, hashed as they arrive."""

    store: VersionStore
    version: int
    kind: str
    base_version: int | None
    checksum: str
    fmt: str
    chunk_bytes: int
    tmp_dir: Path
    companion: bool = False  # the second payload (other kind, same checksum) of a version already held
    total: int = 0
    _whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    _chunk: hashlib._Hash = field(default_factory=hashlib.sha256)
    _chunk_fill: int = 0
    chunks: list[ChunkInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tmp_dir.mkdir(parents=True)
        self._file = open(self.tmp_dir / PAYLOAD, "wb")  # noqa: SIM115 (closed in commit/abort)

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes; blocking (call from a worker thread). The whole-payload sha256 runs on another thread
        beside the chunk hashes and the file write (hashlib releases the GIL): ~1 GB/s each, not ~0.5 together."""
        view = memoryview(data)
        whole = _HASHERS.submit(self._whole.update, view)
        try:
            self._write_chunks(view)
        finally:
            whole.result()
        self.total += len(data)

    def _write_chunks(self, view: memoryview) -> None:
        self._file.write(view)
        while len(view):
            take = min(len(view), self.chunk_bytes - self._chunk_fill)
            self._chunk.update(view[:take])
            self._chunk_fill += take
            view = view[take:]
            if self._chunk_fill == self.chunk_bytes:
                self._close_chunk()

    def _close_chunk(self) -> None:
        offset = len(self.chunks) * self.chunk_bytes
        self.chunks.append(
            ChunkInfo(index=len(self.chunks), offset=offset, length=self._chunk_fill, sha256=self._chunk.hexdigest())
        )
        self._chunk, self._chunk_fill = hashlib.sha256(), 0

    def commit(self) -> Manifest:
        """fsync, write the manifest, rename into place; blocking. Raises StoreError on a conflict."""
        manifest = self.finish()
        try:
            self.store._install(self, manifest)
        except BaseException:
            self.abort()
            raise
        return manifest

    def finish(self, compacted: bool = False) -> Manifest:
        """fsync the payload and write its manifest in the temporary directory; blocking."""
        if self._chunk_fill:
            self._close_chunk()
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        manifest = Manifest(
            version=self.version,
            kind=self.kind,  # type: ignore[arg-type]
            base_version=self.base_version,
            format=self.fmt,
            checksum=self.checksum,
            total_bytes=self.total,
            sha256=self._whole.hexdigest(),
            chunk_bytes=self.chunk_bytes,
            chunks=self.chunks,
            created_at=time.time(),
            compacted=compacted,
            companion=self.companion,
        )
        with open(self.tmp_dir / MANIFEST, "w") as f:
            f.write(manifest.model_dump_json(indent=1))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.tmp_dir)
        return manifest

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


class VersionStore:
    """Versions held on disk, with their manifests in memory. Thread-safe."""

    def __init__(self, data_dir: str | Path, chunk_bytes: int, retain_versions: int) -> None:
        self.root = Path(data_dir)
        self.versions_dir = self.root / "versions"
        self.incoming_dir = self.root / "incoming"
        self.compacted_dir = self.root / "compacted"
        self.chunk_bytes = chunk_bytes
        self.retain_versions = retain_versions
        self._lock = threading.Lock()
        self._manifests: dict[int, Manifest] = {}  # each version's primary (first uploaded) payload
        self._companions: dict[int, Manifest] = {}  # a version's second payload, of the other kind
        self._pending: set[int] = set()  # versions being uploaded right now
        self._pending_companions: set[int] = set()  # companions being uploaded right now
        self._compacted: dict[tuple[int, int], Manifest] = {}
        self._compact_locks: dict[tuple[int, int], threading.Lock] = {}  # one build per (a, b) at a time
        self._load()

    # ---- startup -----------------------------------------------------------------------------
    def _load(self) -> None:
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.incoming_dir, ignore_errors=True)  # leftovers of interrupted uploads
        self.incoming_dir.mkdir(parents=True, exist_ok=True)
        for d in self.versions_dir.iterdir():
            try:
                manifest = Manifest.model_validate_json((d / MANIFEST).read_text())
                if manifest.version != int(d.name) or (d / PAYLOAD).stat().st_size != manifest.total_bytes:
                    raise ValueError("manifest does not match its directory")
            except (OSError, ValueError) as err:
                log.warning("skipping unreadable version directory", extra={"path": str(d), "error": str(err)})
                continue
            self._manifests[manifest.version] = manifest
            self._load_companion(d, manifest)
        self._load_compacted()
        log.info("store loaded", extra={"versions": sorted(self._manifests), "data_dir": str(self.root)})

    def _load_companion(self, d: Path, primary: Manifest) -> None:
        other = d / ("delta" if primary.kind == "full" else "full")
        if not other.is_dir():
            return
        try:
            m = Manifest.model_validate_json((other / MANIFEST).read_text())
            if not m.companion or m.version != primary.version or m.kind == primary.kind:
                raise ValueError("companion manifest does not match its directory")
            if (other / PAYLOAD).stat().st_size != m.total_bytes:
                raise ValueError("companion payload size does not match its manifest")
        except (OSError, ValueError) as err:
            log.warning("dropping unreadable companion payload", extra={"path": str(other), "error": str(err)})
            shutil.rmtree(other, ignore_errors=True)
            return
        self._companions[m.version] = m

    def _load_compacted(self) -> None:
        self.compacted_dir.mkdir(parents=True, exist_ok=True)
        for d in self.compacted_dir.iterdir():
            try:
                m = Manifest.model_validate_json((d / MANIFEST).read_text())
                valid = m.compacted and d.name == f"{m.base_version}-{m.version}"
                if not valid or (d / PAYLOAD).stat().st_size != m.total_bytes:
                    raise ValueError("manifest does not match its directory")
                if m.base_version not in self._manifests or m.version not in self._manifests:
                    raise ValueError("its versions are gone")
            except (OSError, ValueError):
                shutil.rmtree(d, ignore_errors=True)  # a cache: rebuilt on request
                continue
            self._compacted[(m.base_version, m.version)] = m  # type: ignore[index]

    # ---- queries -----------------------------------------------------------------------------
    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._manifests)

    def latest(self) -> int | None:
        with self._lock:
            return max(self._manifests, default=None)

    def manifest(self, version: int, kind: str | None = None) -> Manifest:
        """The version's primary manifest, or with `kind` its payload of that kind (primary or companion)."""
        with self._lock:
            found = self._manifests.get(version)
            companion = self._companions.get(version)
        if found is None:
            raise StoreError(404, f"version {version} is not held (see GET /v1/versions)", "version")
        if kind is None or found.kind == kind:
            return found
        if kind not in ("full", "delta"):
            raise StoreError(422, f"kind must be 'full' or 'delta', got {kind!r}", "kind")
        if companion is None or companion.kind != kind:
            raise StoreError(404, f"version {version} holds no {kind} payload (it is a {found.kind})", "kind")
        return companion

    def payload_path(self, version: int, kind: str | None = None) -> Path:
        return self._file_of(self.manifest(version, kind))

    def _file_of(self, m: Manifest) -> Path:
        """Where a manifest's payload lies on disk."""
        if m.compacted:
            return self.compacted_dir / f"{m.base_version}-{m.version}" / PAYLOAD
        if m.companion:
            return self.versions_dir / str(m.version) / m.kind / PAYLOAD
        return self.versions_dir / str(m.version) / PAYLOAD

    def companion(self, version: int) -> Manifest | None:
        """The version's second payload, if it holds one."""
        with self._lock:
            return self._companions.get(version)

    def compacted_payload_path(self, base: int, version: int) -> Path:
        self.compacted(base, version)
        return self.compacted_dir / f"{base}-{version}" / PAYLOAD

    def bytes_on_disk(self) -> int:
        with self._lock:
            held = [*self._manifests.values(), *self._companions.values()]
        return sum(m.total_bytes for m in held)

    def read_range(self, version: int, start: int, end: int, path: Path | None = None) -> Iterator[bytes]:
        """Yield bytes [start, end] (inclusive) of a payload (version's, or the file `path`) in blocks; blocking."""
        with open(path or self.payload_path(version), "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                block = f.read(min(READ_BLOCK, left))
                if not block:
                    return
                left -= len(block)
                yield block

    # ---- uploads -----------------------------------------------------------------------------
    def begin_upload(
        self, version: int, kind: str, checksum: str, base_version: int | None = None, fmt: str | None = None
    ) -> Upload:
        """Validate an upload's metadata and reserve its version; raises StoreError with the field at fault."""
        if kind not in ("full", "delta"):
            raise StoreError(422, f"kind must be 'full' or 'delta', got {kind!r}", "kind")
        if not checksum:
            raise StoreError(422, "checksum of the whole parameter state is required", "checksum")
        if version < 0:
            raise StoreError(422, f"version must be >= 0, got {version}", "version")
        if kind == "full" and base_version is not None:
            raise StoreError(422, "base_version is only for deltas; leave it out for a full snapshot", "base_version")
        with self._lock:
            companion = self._is_companion(version, kind, checksum, base_version)
            if companion:
                self._pending_companions.add(version)
            else:
                self._check_version(version, kind, base_version)
                self._pending.add(version)
        fmt = fmt or ("safetensors" if kind == "full" else "rlboost-delta")
        tmp = self.incoming_dir / f"{version}-{uuid.uuid4().hex}"
        try:
            return Upload(self, version, kind, base_version, checksum, fmt, self.chunk_bytes, tmp, companion)
        except BaseException:
            with self._lock:
                (self._pending_companions if companion else self._pending).discard(version)
            raise

    def _is_companion(self, version: int, kind: str, checksum: str, base_version: int | None) -> bool:
        """Under the lock: True when this upload adds the other kind's payload to a held version.

        Raises StoreError when it would, but cannot: a different checksum, a companion already held or
        uploading, or a delta whose base is not an older held version.
        """
        primary = self._manifests.get(version)
        if primary is None or primary.kind == kind:
            return False  # a new version, or a re-upload of the same kind: the ordinary rules answer
        if version in self._companions or version in self._pending_companions:
            raise StoreError(409, f"version {version} already holds a full snapshot and a delta", "version")
        if checksum != primary.checksum:
            raise StoreError(
                409,
                f"version {version} is held with checksum {primary.checksum[:16]}; a second payload of it must "
                "produce the same state (same checksum)",
                "checksum",
            )
        if kind == "delta":
            if base_version is None:
                raise StoreError(422, "a delta needs its base version (header X-Rlboost-Base-Version)", "base_version")
            if base_version not in self._manifests or base_version >= version:
                raise StoreError(
                    422, f"base_version {base_version} must be an older version the server holds", "base_version"
                )
        return True

    def _check_version(self, version: int, kind: str, base_version: int | None) -> None:
        """Under the lock: the version is new and above the latest; a delta's base is held."""
        if version in self._manifests or version in self._pending:
            raise StoreError(409, f"version {version} already exists; versions are immutable", "version")
        newest = max([*self._manifests, *self._pending], default=None)
        if newest is not None and version <= newest:
            raise StoreError(409, f"version {version} is not newer than the latest version {newest}", "version")
        if kind == "delta":
            if base_version is None:
                raise StoreError(422, "a delta needs its base version (header X-Rlboost-Base-Version)", "base_version")
            if base_version not in self._manifests:
                raise StoreError(
                    422, f"base_version {base_version} is not held; upload a full snapshot instead", "base_version"
                )
            if base_version >= version:
                raise StoreError(
                    422, f"base_version {base_version} must be older than version {version}", "base_version"
                )

    def uploading(self) -> list[int]:
        """Versions being uploaded right now (snapshots and companions)."""
        with self._lock:
            return sorted(self._pending | self._pending_companions)

    def release(self, upload: Upload) -> None:
        """Forget a failed upload's reservation and its temporary files."""
        upload.abort()
        with self._lock:
            (self._pending_companions if upload.companion else self._pending).discard(upload.version)

    def _install(self, upload: Upload, manifest: Manifest) -> None:
        if upload.companion:
            self._install_companion(upload, manifest)
            return
        target = self.versions_dir / str(upload.version)
        with self._lock:
            self._pending.discard(upload.version)
            if upload.kind == "delta" and upload.base_version not in self._manifests:
                raise StoreError(
                    409, f"base_version {upload.base_version} was removed during the upload", "base_version"
                )
            os.rename(upload.tmp_dir, target)
            _fsync_dir(self.versions_dir)
            self._manifests[upload.version] = manifest
            doomed = self._expired()
            for v in doomed:
                del self._manifests[v]
            stale = [k for k in self._compacted if k[0] not in self._manifests or k[1] not in self._manifests]
            for k in stale:
                del self._compacted[k]
                self._compact_locks.pop(k, None)
            for v in doomed:
                self._companions.pop(v, None)
        self._remove(doomed, stale)

    def _install_companion(self, upload: Upload, manifest: Manifest) -> None:
        """Put a version's second payload beside its first (atomic rename into versions/<v>/<kind>)."""
        version = upload.version
        with self._lock:
            self._pending_companions.discard(version)
            if version not in self._manifests:
                raise StoreError(404, f"version {version} was removed by retention during the upload", "version")
            if upload.kind == "delta" and upload.base_version not in self._manifests:
                raise StoreError(
                    409, f"base_version {upload.base_version} was removed during the upload", "base_version"
                )
            parent = self.versions_dir / str(version)
            os.rename(upload.tmp_dir, parent / upload.kind)
            _fsync_dir(parent)
            self._companions[version] = manifest
            # A companion snapshot ends its version's chain: older versions may now expire.
            doomed = self._expired()
            for v in doomed:
                del self._manifests[v]
                self._companions.pop(v, None)
            stale = [k for k in self._compacted if k[0] not in self._manifests or k[1] not in self._manifests]
            for k in stale:
                del self._compacted[k]
                self._compact_locks.pop(k, None)
        self._remove(doomed, stale)

    def _remove(self, doomed: list[int], stale: list[tuple[int, int]]) -> None:
        for v in doomed:
            shutil.rmtree(self.versions_dir / str(v), ignore_errors=True)
        for a, b in stale:
            shutil.rmtree(self.compacted_dir / f"{a}-{b}", ignore_errors=True)
        if doomed:
            log.info("retention removed versions", extra={"removed": doomed})

    # ---- retention and sync plans ------------------------------------------------------------
    def _has_full(self, v: int, manifests: dict[int, Manifest], companions: dict[int, Manifest]) -> bool:
        return manifests[v].kind == "full" or (v in companions and companions[v].kind == "full")

    def _expired(self) -> list[int]:
        """Under the lock: versions outside the newest `retain_versions` that no retained delta needs.

        A retained version's chain runs back along delta bases to the nearest version holding a full snapshot.
        """
        newest = sorted(self._manifests, reverse=True)[: self.retain_versions]
        keep: set[int] = set()
        for v in newest:
            while v is not None and v not in keep and v in self._manifests:
                keep.add(v)
                m = self._manifests[v]
                full = self._has_full(v, self._manifests, self._companions)
                v = None if full else m.base_version
        return sorted(set(self._manifests) - keep)

    def _by_kind(self) -> tuple[set[int], dict[int, Manifest], dict[int, Manifest]]:
        """One consistent snapshot: (versions held, full manifests, delta manifests by version), primaries and
        companions alike."""
        with self._lock:
            versions = set(self._manifests)
            held = [*self._manifests.values(), *self._companions.values()]
        fulls = {m.version: m for m in held if m.kind == "full"}
        deltas = {m.version: m for m in held if m.kind == "delta"}
        return versions, fulls, deltas

    def sync_plan(self, from_version: int | None, to_version: int | None, compact: bool = True) -> list[Manifest]:
        """Manifests a worker at `from_version` (None: holds nothing) applies in order to reach `to_version`.

        Walk back from the target along delta bases (a version's primary or companion delta). Reaching
        `from_version` gives the delta chain (the worker holds that state, so the server need not); the
        nearest version holding a full snapshot gives snapshot + deltas. A snapshot version that also holds
        the delta from the version before does not end the walk, so a worker just behind it gets the delta.
        With `compact`, a run of two or more deltas may be replaced by one compacted delta. Of the
        candidates, fewer total bytes wins (blocking: building a compacted delta reads and composes the chain).
        """
        held, fulls, deltas = self._by_kind()
        if to_version is None:
            to_version = max(held, default=None)
            if to_version is None:
                raise StoreError(404, "no version has been uploaded yet", "to")
        if to_version not in held:
            raise StoreError(404, f"version {to_version} is not held (see GET /v1/versions)", "to")
        if from_version is not None and from_version > to_version:
            raise StoreError(422, f"from ({from_version}) must not be newer than to ({to_version})", "from")
        if from_version == to_version:
            return []
        chain, snapshot = self._walk_back(from_version, to_version, fulls, deltas)
        candidates = [c for c in (chain, snapshot) if c is not None]
        if not candidates:
            raise StoreError(409, f"version {to_version} cannot be rebuilt: its delta chain lost its base", "to")
        if compact:
            candidates += self._compacted_candidates(chain, snapshot)
        return min(candidates, key=lambda c: (sum(m.total_bytes for m in c), len(c)))

    @staticmethod
    def _walk_back(
        from_version: int | None, to_version: int, fulls: dict[int, Manifest], deltas: dict[int, Manifest]
    ) -> tuple[list[Manifest] | None, list[Manifest] | None]:
        """(delta chain from `from_version`, nearest snapshot + deltas) ending at `to_version`; None where none."""
        path: list[Manifest] = []  # deltas walked so far, newest first
        chain: list[Manifest] | None = None
        snapshot: list[Manifest] | None = None
        v = to_version
        while True:
            if v == from_version:
                chain = list(reversed(path))
            if snapshot is None and v in fulls:
                snapshot = [fulls[v], *reversed(path)]
            # Past the snapshot, walking on only helps to reach from_version (still older than v).
            if snapshot is not None and (chain is not None or from_version is None or from_version > v):
                break
            d = deltas.get(v)
            if d is None or d.base_version is None:
                break
            path.append(d)
            v = d.base_version
        return chain, snapshot

    def _compacted_candidates(
        self, chain: list[Manifest] | None, snapshot: list[Manifest] | None
    ) -> list[list[Manifest]]:
        """The chain as one compacted delta; the snapshot followed by one compacted delta."""
        out = []
        if chain is not None and len(chain) >= 2:
            one = self._try_compacted(chain)
            if one is not None:
                out.append([one])
        if snapshot is not None and len(snapshot) >= 3:
            one = self._try_compacted(snapshot[1:])
            if one is not None:
                out.append([snapshot[0], one])
        return out

    def _try_compacted(self, run: list[Manifest]) -> Manifest | None:
        try:
            return self.compacted(run[0].base_version, run[-1].version)  # type: ignore[arg-type]
        except StoreError as err:  # e.g. deltas in a format the server cannot compose: serve the chain
            log.warning(
                "no compacted delta", extra={"base": run[0].base_version, "to": run[-1].version, "error": err.message}
            )
            return None

    # ---- compacted deltas --------------------------------------------------------------------
    def compacted(self, base: int, version: int) -> Manifest:
        """The compacted base->version delta's manifest, composing and caching it on first request; blocking."""
        key = (base, version)
        with self._lock:
            found = self._compacted.get(key)
            if found is not None:
                return found
            gate = self._compact_locks.setdefault(key, threading.Lock())
        with gate:  # concurrent requests for the same pair build it once
            with self._lock:
                found = self._compacted.get(key)
            return found if found is not None else self._build_compacted(base, version)

    def _delta_run(self, base: int, version: int) -> list[Manifest]:
        """The stored deltas (primary or companion) leading from `base` to `version`, oldest first; StoreError
        if there is none."""
        _, _, deltas = self._by_kind()
        run: list[Manifest] = []
        v = version
        while v != base:
            m = deltas.get(v)
            if m is None or m.kind != "delta" or m.base_version is None or m.base_version < base:
                raise StoreError(
                    404, f"no chain of stored deltas leads from version {base} to {version}", "base_version"
                )
            run.append(m)
            v = m.base_version
        if not run:
            raise StoreError(422, f"a compacted delta needs two different versions, got {base} and {version}", "to")
        return list(reversed(run))

    def _build_compacted(self, base: int, version: int) -> Manifest:
        from rlboost.delta.compact import compose_chain
        from rlboost.delta.format import DeltaError

        with self._lock:
            held = base in self._manifests
        if not held:  # a cache entry lives only while both its versions do
            raise StoreError(404, f"version {base} is not held: no compacted delta from it", "base_version")
        run = self._delta_run(base, version)
        if any(m.format != "rlboost-delta" for m in run):
            raise StoreError(422, f"deltas {base}->{version} are not all in the rlboost-delta format", "format")
        try:
            payload = compose_chain([self._file_of(m).read_bytes() for m in run])
        except DeltaError as err:
            raise StoreError(422, f"cannot compact deltas {base}->{version}: {err}", "base_version") from None
        except OSError:  # a version of the run was removed meanwhile
            raise StoreError(404, f"deltas {base}->{version} were removed by retention", "base_version") from None
        tmp = self.incoming_dir / f"compacted-{base}-{version}-{uuid.uuid4().hex}"
        up = Upload(self, version, "delta", base, run[-1].checksum, "rlboost-delta", self.chunk_bytes, tmp)
        try:
            up.write(payload)
            manifest = up.finish(compacted=True)
            target = self.compacted_dir / f"{base}-{version}"
            with self._lock:
                if base not in self._manifests or version not in self._manifests:
                    raise StoreError(404, f"deltas {base}->{version} were removed by retention", "base_version")
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
                self._compacted[(base, version)] = manifest
        except BaseException:
            up.abort()
            raise
        log.info(
            "compacted delta built",
            extra={
                "base": base,
                "to": version,
                "bytes": manifest.total_bytes,
                "chain_bytes": sum(m.total_bytes for m in run),
            },
        )
        return manifest

    def compacted_count(self) -> int:
        with self._lock:
            return len(self._compacted)
