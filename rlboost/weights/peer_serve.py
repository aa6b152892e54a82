"""A worker's peer server: the weight payloads it holds, served to other workers as the weight-server serves them.

    cache = PayloadCache(tmpdir, keep=4)
    server = PeerServer(cache, token=worker_token)
    url = await server.start("127.0.0.1", 0)      # the base URL to advertise
    entry = cache.begin(manifest)                  # before the pull: chunks are served as soon as verified
    entry.chunk_verified(chunk, view); entry.finish()

Routes: GET /v1<payload_path> with one `Range` (the weight-server's protocol: 206 with Content-Range; 200 without
Range), GET /healthz. A range whose chunks this worker is still pulling waits for them (up to `wait_s`, then 503:
the puller goes to another source); a payload it does not hold is a 404. Reads need the job's worker token when
one is given. Only chunks whose sha256 matched the manifest are ever served, and pullers check them again.

The bytes are copied to a file per payload as each chunk is verified: the pulled buffer itself is not kept,
because the engine's tensors are views of a snapshot's buffer and later deltas change them in place. Ranges go out
with sendfile, from the page cache to the socket without passing through Python.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hmac
import logging
import os
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from rlboost.wire import weight_routes as routes
from rlboost.wire.weights_io import ChunkInfo, Manifest

log = logging.getLogger(__name__)
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class CachedPayload:
    """One payload on disk: its manifest, which chunks are verified, and waiters for the rest."""

    def __init__(self, manifest: Manifest, path: Path) -> None:
        self.manifest, self.path = manifest, path
        self.done = [False] * len(manifest.chunks)
        self.complete = self.failed = False
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}  # chunk index -> requests waiting for it
        starts = [c.offset for c in manifest.chunks]
        self._starts = starts if starts == sorted(starts) else None  # for covers' bisection
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self._fd, manifest.total_bytes)
        self._file = os.fdopen(os.dup(self._fd), "rb", buffering=0)  # what sendfile reads from

    async def chunk_verified(self, chunk: ChunkInfo, data: memoryview) -> None:
        """Keep a verified chunk's bytes (a copy, written off the event loop) and serve them from now on."""
        self.written(chunk, await asyncio.to_thread(self.write, chunk, data))

    def write(self, chunk: ChunkInfo, data: memoryview) -> OSError | None:
        """Blocking (a worker thread, e.g. the one that just verified the chunk): copy its bytes to the file."""
        if self.failed:
            return None
        try:
            os.pwrite(self._fd, data, chunk.offset)
        except OSError as err:
            return err
        return None

    def written(self, chunk: ChunkInfo, error: OSError | None) -> None:
        """On the event loop, after `write`: the chunk is served from now on."""
        if self.failed:
            return
        if error is not None:  # a full disk stops the serving of this payload, never the worker's own pull
            log.warning("peer cache write failed; not serving this payload", extra={"error": str(error)})
            self.abort()
            return
        self.done[chunk.index] = True
        self._wake(self._waiters.pop(chunk.index, []))

    def finish(self) -> None:
        self.complete = all(self.done)
        self._wake_all()

    def abort(self) -> None:
        """The pull failed: waiters are answered 404 and the payload is dropped by the cache."""
        self.failed = True
        self._wake_all()

    def _wake_all(self) -> None:
        waiting, self._waiters = self._waiters, {}
        for futures in waiting.values():
            self._wake(futures)

    @staticmethod
    def _wake(futures: list[asyncio.Future[None]]) -> None:
        for future in futures:
            if not future.done():
                future.set_result(None)

    def covers(self, start: int, end: int) -> list[int]:
        """Indexes of the chunks overlapping bytes start..end (inclusive). Chunks in offset order (the weight-server's
        are) are found by bisection: a scan of every chunk per request grows with the model (4,096 chunks for 16 GB
        at the default 4 MiB), and showed in the fan-out profile at 64."""
        chunks = self.manifest.chunks
        if self._starts is None:
            lo, hi = 0, len(chunks)
        else:
            lo, hi = max(0, bisect.bisect_right(self._starts, start) - 1), bisect.bisect_right(self._starts, end)
        return [c.index for c in chunks[lo:hi] if c.offset <= end and c.offset + c.length > start]

    async def wait_for(self, indexes: list[int], wait_s: float) -> bool:
        """Whether every chunk in `indexes` is verified, waiting up to `wait_s` for the pull to bring them. A waiter
        is woken by the chunk it lacks (or the pull's end), not by every chunk: a chain's pullers wait on each
        link's chunks as they arrive, and a wake-up of every waiter per chunk was a fan-out hot spot (issue 34)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (missing := next((i for i in indexes if not self.done[i]), None)) is not None:
            if self.failed or self.complete or loop.time() >= deadline:
                return False
            arrived: asyncio.Future[None] = loop.create_future()
            waiting = self._waiters.setdefault(missing, [])
            waiting.append(arrived)
            try:
                await asyncio.wait([arrived], timeout=deadline - loop.time())
            finally:
                if not arrived.done():  # timed out or cancelled: no longer waiting
                    arrived.cancel()
                    with contextlib.suppress(ValueError):
                        waiting.remove(arrived)
        return True

    async def send(self, transport: asyncio.BaseTransport, start: int, end: int) -> None:
        """Bytes start..end to the socket by sendfile: page cache to socket in the kernel, no copy through Python
        and no thread per block (asyncio falls back to reads and writes where the transport cannot, e.g. TLS)."""
        await asyncio.get_running_loop().sendfile(transport, self._file, start, end - start + 1)  # type: ignore[arg-type]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(OSError):
            self._file.close()
        self.path.unlink(missing_ok=True)


class PayloadCache:
    """The payloads this worker serves, by payload path: the `keep` most recent ones (a snapshot is the model's size
    on disk; older payloads are of versions few pullers still need)."""

    def __init__(self, directory: str | Path, keep: int = 4) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory, self.keep = Path(directory), keep
        self.directory.mkdir(parents=True, exist_ok=True)
        self.entries: OrderedDict[str, CachedPayload] = OrderedDict()

    def begin(self, manifest: Manifest) -> CachedPayload:
        """A fresh entry for a payload about to be pulled (replacing an older one of the same path)."""
        path = manifest.payload_path
        self.drop(path)
        name = manifest.sha256[:32] + path.replace("/", "_")
        entry = self.entries[path] = CachedPayload(manifest, self.directory / name)
        while len(self.entries) > self.keep:
            self.drop(next(iter(self.entries)))
        return entry

    def get(self, path: str) -> CachedPayload | None:
        entry = self.entries.get(path)
        if entry is not None and entry.failed:
            self.drop(path)
            return None
        return entry

    def drop(self, path: str) -> None:
        entry = self.entries.pop(path, None)
        if entry is not None:
            entry.abort()
            entry.close()

    def held(self) -> list[str]:
        """Paths of the payloads held whole (what the directory is told)."""
        return [p for p, e in self.entries.items() if e.complete]

    def close(self) -> None:
        for path in list(self.entries):
            self.drop(path)
        shutil.rmtree(self.directory, ignore_errors=True)


class PeerServer:
    """aiohttp server over a PayloadCache, in the worker's event loop (the cache's waiters live there)."""

    def __init__(
        self,
        cache: PayloadCache,
        token: str | None = None,
        wait_s: float = 30.0,
        on_served: Callable[[int], None] | None = None,
    ) -> None:
        """`on_served(nbytes)`: called after each range is sent (metrics)."""
        self.cache, self.token, self.wait_s, self.on_served = cache, token, wait_s, on_served
        self.bytes_served = 0
        self._runner: web.AppRunner | None = None
        app = web.Application()
        app.router.add_get(routes.HEALTHZ, self._healthz)
        app.router.add_get(routes.api("/{path:.+}"), self._payload)  # any payload route; the cache knows which it holds
        self.app = app

    async def start(self, host: str, port: int, advertise: str = "") -> str:
        """Listen on host:port (0: a free port); returns the base URL (`advertise` replaces the host in it)."""
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)  # pullers keep alive
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # the port 0 picked
        return f"http://{advertise or host}:{bound}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _payload(self, request: web.Request) -> web.StreamResponse:
        if self.token and not _bearer_matches(request, self.token):
            return _error(401, "peer reads need 'Authorization: Bearer <the job's worker token>'", "Authorization")
        entry = self.cache.get("/" + request.match_info["path"])
        if entry is None:
            return _error(404, "this peer does not hold that payload; ask the weight-server", "path")
        size = entry.manifest.total_bytes
        span = _parse_range(request.headers.get("Range"), size)
        if span is None:
            return _error(416, f"use one range 'bytes=START-END' within the {size}-byte payload", "Range")
        start, end = span
        if not await entry.wait_for(entry.covers(start, end), self.wait_s):
            return _error(503, "this peer does not hold those chunks (yet); fetch them elsewhere", "Range")
        ranged = "Range" in request.headers
        resp = web.StreamResponse(status=206 if ranged else 200)
        resp.headers.update({"Accept-Ranges": "bytes", "ETag": f'"{entry.manifest.sha256}"'})
        if ranged:
            resp.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        resp.content_length = end - start + 1
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)  # the status line and headers go out now, ahead of the file's bytes
        if request.transport is None:
            raise ConnectionResetError("the puller went away")
        await entry.send(request.transport, start, end)
        await resp.write_eof()
        self.bytes_served += end - start + 1
        if self.on_served is not None:
            self.on_served(end - start + 1)
        return resp


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Wait until `event` is set or `timeout` passes. Not asyncio.wait_for: on Python 3.11 it can swallow a
    cancellation that arrives as the event is set, and a cancelled heartbeat then never stops."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiter], timeout=max(0.0, timeout))
    finally:
        waiter.cancel()


def _bearer_matches(request: web.Request, token: str) -> bool:
    auth = request.headers.get("Authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return bool(given) and hmac.compare_digest(given.encode(), token.encode())


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end) inclusive of `bytes=a-b` / `bytes=a-` (what pullers send); the whole payload without a header."""
    if header is None:
        return (0, size - 1) if size else None
    m = _RANGE.match(header.strip())
    if not m:
        return None
    start = int(m.group(1))
    end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
    return (start, end) if start <= end else None


def _error(status: int, message: str, field: str) -> web.Response:
    return web.json_response({"error": message, "field": field}, status=status)
