"""Weight versions on disk: `<data-dir>/versions/<v>/payload` + `manifest.json`; the store's transactions.

An upload streams into `<data-dir>/incoming/<random>/` while its whole and per-chunk sha256 are
computed on the fly; on commit the files are fsynced and the directory is renamed into
`versions/<v>` (atomic on one filesystem), so a crash never leaves a half-written version visible.
On start the store reloads every complete version and clears leftovers of interrupted uploads.
A version's companion (its second payload, of the other kind: planning.py) is installed atomically
under `versions/<v>/<kind>/`.

Compacted deltas: `compacted(a, b)` composes the stored chain a->...->b into one delta
(rlboost.delta.compose_chain, torch-free) and caches it under `<data-dir>/compacted/<a>-<b>/`
(same payload + manifest layout, installed atomically); it is dropped with a or b, and the cache holds at most
`compacted_cache_bytes` (least recently used evicted first; a delta larger than the whole cache is not built:
the chain is served instead).

What fits, what retention drops and which payloads a sync plan serves are decided by planning.py, pure;
this module holds the files, the lock and the manifests in memory, and carries the decisions out.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rlboost.fsio import fsync_dir
from rlboost.wire.weights_io import ChunkInfo, Manifest

from . import memory, planning
from .errors import ErrorKind, StoreError, storing
from .planning import Holdings

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PAYLOAD = "payload"
READ_BLOCK = 1 << 20


def _removed_meanwhile(base: int, version: int) -> StoreError:
    return StoreError(ErrorKind.NOT_FOUND, f"deltas {base}->{version} were removed by retention", "base_version")


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
    signature: str | None = None  # the trainer's, kept in the manifest as uploaded (the server cannot check it)
    total: int = 0
    _whole: hashlib._Hash = field(default_factory=hashlib.sha256)
    _chunk: hashlib._Hash = field(default_factory=hashlib.sha256)
    _chunk_fill: int = 0
    chunks: list[ChunkInfo] = field(default_factory=list)

    def __post_init__(self) -> None:
        with storing(self.what, self.store.root):
            self.tmp_dir.mkdir(parents=True)
            self._file = open(self.tmp_dir / PAYLOAD, "wb")  # noqa: SIM115 (closed in commit/abort)

    @property
    def what(self) -> str:
        return f"{'compacted delta' if self.tmp_dir.name.startswith('compacted-') else 'version'} {self.version}"

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes; blocking (call from a worker thread). The whole-payload sha256 runs on another thread
        beside the chunk hashes and the file write (hashlib releases the GIL): ~1 GB/s each, not ~0.5 together."""
        view = memoryview(data)
        whole = _HASHERS.submit(self._whole.update, view)
        try:
            with storing(self.what, self.store.root):
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
        with storing(self.what, self.store.root):
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
            signature=self.signature,
        )
        with storing(self.what, self.store.root), open(self.tmp_dir / MANIFEST, "w") as f:
            f.write(manifest.model_dump_json(indent=1))
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.tmp_dir)
        return manifest

    def abort(self) -> None:
        if hasattr(self, "_file") and not self._file.closed:
            with contextlib.suppress(OSError):  # a full disk fails the close's flush too: the file goes anyway
                self._file.close()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


DEFAULT_COMPACTED_CACHE_BYTES = 2 << 30  # the weight-server's --compacted-cache-bytes default


class VersionStore:
    """Versions held on disk, with their manifests in memory. Thread-safe."""

    def __init__(
        self,
        data_dir: str | Path,
        chunk_bytes: int,
        retain_versions: int,
        compacted_cache_bytes: int = DEFAULT_COMPACTED_CACHE_BYTES,
    ) -> None:
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
        self._compacted: OrderedDict[tuple[int, int], Manifest] = OrderedDict()  # least recently used first
        self.compacted_cache_bytes = compacted_cache_bytes
        self.compacted_evictions = 0
        self.on_compacted_evicted: Callable[[int], None] = lambda n: None  # metrics hook: n deltas evicted
        self._compact_locks: dict[tuple[int, int], threading.Lock] = {}  # one build per (a, b) at a time
        self._building = threading.Lock()  # one build at a time at all: its chain and result bound the memory
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
        self._evict_compacted(keep=None)  # the cap may have shrunk since they were built

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
            return self._held().payload(version, kind)

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
        self,
        version: int,
        kind: str,
        checksum: str,
        base_version: int | None = None,
        fmt: str | None = None,
        signature: str | None = None,
        chunk_bytes: int | None = None,
    ) -> Upload:
        """Validate an upload's metadata and reserve its version; raises StoreError with the field at fault.
        A signed upload names the chunk size its signed manifest was computed with (else the store's)."""
        planning.check_signed_layout(signature, chunk_bytes)
        with self._lock:
            companion = planning.admit_upload(
                self._held(), self._pending, self._pending_companions, version, kind, checksum, base_version
            )
            (self._pending_companions if companion else self._pending).add(version)
        fmt = fmt or ("safetensors" if kind == "full" else "rlboost-delta")
        tmp = self.incoming_dir / f"{version}-{uuid.uuid4().hex}"
        try:
            chunks = chunk_bytes or self.chunk_bytes
            return Upload(self, version, kind, base_version, checksum, fmt, chunks, tmp, companion, signature or None)
        except BaseException:
            with self._lock:
                (self._pending_companions if companion else self._pending).discard(version)
            raise

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
        """Rename the upload into place (a new version, or a companion beside its version's first payload) and
        apply retention: a new version, or a companion snapshot that ends its version's chain, may expire older
        ones."""
        with self._lock:
            (self._pending_companions if upload.companion else self._pending).discard(upload.version)
            planning.check_install(self._held(), manifest)
            if upload.companion:
                parent = self.versions_dir / str(upload.version)
                os.rename(upload.tmp_dir, parent / upload.kind)
                fsync_dir(parent)
                self._companions[upload.version] = manifest
            else:
                os.rename(upload.tmp_dir, self.versions_dir / str(upload.version))
                fsync_dir(self.versions_dir)
                self._manifests[upload.version] = manifest
            dropped = planning.retention(self._held(), self._compacted, self.retain_versions)
            for v in dropped.versions:
                del self._manifests[v]
                self._companions.pop(v, None)
            for k in dropped.compacted:
                del self._compacted[k]
                self._compact_locks.pop(k, None)
        self._remove(dropped)

    def _remove(self, dropped: planning.Retention) -> None:
        for v in dropped.versions:
            shutil.rmtree(self.versions_dir / str(v), ignore_errors=True)
        for a, b in dropped.compacted:
            shutil.rmtree(self.compacted_dir / f"{a}-{b}", ignore_errors=True)
        if dropped.versions:
            log.info("retention removed versions", extra={"removed": dropped.versions})

    # ---- sync plans --------------------------------------------------------------------------
    def _held(self) -> Holdings:
        """Under the lock: the manifests held, for the planner (the maps themselves: use them under the lock)."""
        return Holdings(self._manifests, self._companions)

    def _snapshot(self) -> Holdings:
        """One consistent copy of the manifests held, to plan on outside the lock."""
        with self._lock:
            return Holdings(dict(self._manifests), dict(self._companions))

    def sync_plan(self, from_version: int | None, to_version: int | None, compact: bool = True) -> list[Manifest]:
        """Manifests a worker at `from_version` (None: holds nothing) applies in order to reach `to_version`.

        The planner's routes (the delta chain, the nearest snapshot + deltas), and with `compact` each run of
        two or more deltas as one compacted delta; the fewest bytes win (blocking: building a compacted delta
        reads and composes the chain).
        """
        routes = planning.sync_routes(self._snapshot(), from_version, to_version)
        candidates = routes.candidates()
        if compact:
            for head, run in routes.compactable():
                one = self._try_compacted(run)
                if one is not None:
                    candidates.append([*head, one])
        return planning.cheapest(candidates)

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
                self._compacted.move_to_end(key)
                return found
            gate = self._compact_locks.setdefault(key, threading.Lock())
        with gate:  # concurrent requests for the same pair build it once
            with self._lock:
                found = self._compacted.get(key)
            if found is not None:
                return found
            with self._building:
                try:
                    return self._build_compacted(base, version)
                finally:
                    memory.trim()  # the chain and the composed delta are freed: give the memory back

    def _build_compacted(self, base: int, version: int) -> Manifest:
        from rlboost.delta.compact import compose_chain
        from rlboost.delta.format import DeltaError

        run = planning.compaction_run(self._snapshot(), base, version)
        try:
            payload = compose_chain([self._file_of(m).read_bytes() for m in run])
        except DeltaError as err:
            raise StoreError(
                ErrorKind.INVALID, f"cannot compact deltas {base}->{version}: {err}", "base_version"
            ) from None
        except OSError:  # a version of the run was removed meanwhile
            raise _removed_meanwhile(base, version) from None
        if len(payload) > self.compacted_cache_bytes:
            raise StoreError(
                ErrorKind.INVALID,
                f"compacted delta {base}->{version} ({len(payload)} bytes) exceeds the compaction cache "
                f"(--compacted-cache-bytes {self.compacted_cache_bytes}); fetch the chain",
                "base_version",
            )
        tmp = self.incoming_dir / f"compacted-{base}-{version}-{uuid.uuid4().hex}"
        up = Upload(self, version, "delta", base, run[-1].checksum, planning.COMPOSABLE_FORMAT, self.chunk_bytes, tmp)
        try:
            up.write(payload)
            manifest = up.finish(compacted=True)
            target = self.compacted_dir / f"{base}-{version}"
            with self._lock:
                if base not in self._manifests or version not in self._manifests:
                    raise _removed_meanwhile(base, version)
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
                self._compacted[(base, version)] = manifest
                self._evict_compacted(keep=(base, version))
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

    def _evict_compacted(self, keep: tuple[int, int] | None) -> None:
        """Under the lock (or at start-up): drop least recently used compacted deltas, never `keep`, until the
        cache fits `compacted_cache_bytes`. A reader that already opened an evicted payload finishes reading it."""
        evicted = 0
        while self.compacted_bytes_locked() > self.compacted_cache_bytes:
            key = next((k for k in self._compacted if k != keep), None)
            if key is None:
                break
            del self._compacted[key]
            self._compact_locks.pop(key, None)
            shutil.rmtree(self.compacted_dir / f"{key[0]}-{key[1]}", ignore_errors=True)
            evicted += 1
        if evicted:
            self.compacted_evictions += evicted
            self.on_compacted_evicted(evicted)
            log.info("compaction cache evicted", extra={"evicted": evicted, "bytes": self.compacted_bytes_locked()})

    def compacted_bytes_locked(self) -> int:
        return sum(m.total_bytes for m in self._compacted.values())

    def compacted_bytes(self) -> int:
        """Bytes of compacted deltas cached on disk."""
        with self._lock:
            return self.compacted_bytes_locked()

    def compacted_count(self) -> int:
        with self._lock:
            return len(self._compacted)


def read_if_cached(path: Path, start: int, end: int) -> memoryview | None:
    """Bytes [start, end] (inclusive) of the file at `path` when the page cache holds every one of them, read without
    ever waiting on the disk (preadv with RWF_NOWAIT), so on the event loop; None otherwise (the caller reads in a
    thread). A just-uploaded version is in the page cache, and a relay's chunk-sized ranges then skip the thread trip
    and the two wake-ups it costs: on a loaded machine those were most of each range's latency (issue 34)."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return None
    buf = bytearray(end - start + 1)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        got = os.preadv(fd, [buf], start, flag)
    except OSError:  # EAGAIN: not all cached; EOPNOTSUPP: the file system cannot say
        return None
    finally:
        os.close(fd)
    return memoryview(buf) if got == len(buf) else None
