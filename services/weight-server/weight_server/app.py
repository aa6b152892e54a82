"""The weight-server's FastAPI app: versions, manifests, ranged payloads, uploads and sync plans.

Routes (rlboost.wire.weight_routes; bodies: rlboost.wire.weights_io): GET /v1/versions, GET /v1/versions/{v}/manifest[?kind=full|delta],
GET /v1/versions/{v}/payload (Range), GET /v1/versions/{v}/{kind}/payload (a version's payload of that kind:
a snapshot version may also hold the delta from the version before, its companion), PUT /v1/versions/{v}
(trainer token; a second PUT of the other kind adds a companion, not announced again; the trainer's signature
and chunk size headers are kept: rlboost.weights.signing), GET /v1/sync?from=A&to=B[&compact=0],
GET /v1/compacted/{a}/{b}/manifest and /payload (Range; composed from the chain on first request),
GET /v1/assets, GET /v1/assets/{name}, PUT /v1/assets/{name} (bearer token; the model's config, tokenizer and
chat template: assets.py), GET /healthz, GET /metrics. Errors are JSON: {"error": "...", "field": "..."}.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from rlboost import gc_pauses
from rlboost.auth.worker_identity import WorkerIdentityVerifier
from rlboost.observability import LoopWatchdog
from rlboost.weights.peers import DirectoryFull, PeerDirectory
from rlboost.wire import weight_routes as routes
from rlboost.wire.events import WeightsAnnounced
from rlboost.wire.peers_io import WORKER_ID_PATTERN, PeerRegistration, SourceList, SourcesRequest, StalledPeer
from rlboost.wire.weights_io import (
    HEADER_BASE_VERSION,
    HEADER_CHECKSUM,
    HEADER_CHUNK_BYTES,
    HEADER_FORMAT,
    HEADER_KIND,
    HEADER_SIGNATURE,
    MAX_ASSET_BYTES,
    AssetInfo,
    AssetList,
    Manifest,
    VersionList,
)

from .access import Access
from .announce import Announcer
from .assets import AssetStore
from .deadlines import BODY_TIMEOUT_S, BodyDeadline
from .errors import ErrorKind, StoreError
from .metrics import WeightServerMetrics
from .peer_access import PeerAccess
from .store import READ_BLOCK, Upload, VersionStore, read_if_cached

log = logging.getLogger(__name__)

WRITE_BUFFER = 4 << 20  # upload bytes gathered before one (threaded) disk write
MAX_PEER_BODY = 64 << 10  # a peer registration or sources request: a URL, a zone and at most 64 payload paths
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")

# The one place a refusal's domain kind becomes an HTTP status.
HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.INVALID: 422,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.RANGE_NOT_SATISFIABLE: 416,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.INSUFFICIENT_STORAGE: 507,
}


def _error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def _unsatisfiable(message: str) -> StoreError:
    return StoreError(ErrorKind.RANGE_NOT_SATISFIABLE, message, "Range")


def parse_range(header: str, size: int) -> tuple[int, int]:
    """(start, end) inclusive for `bytes=a-b`, `bytes=a-` or `bytes=-n`; a StoreError (unsatisfiable) otherwise."""
    m = _RANGE.match(header.strip())
    if not m or (not m.group(1) and not m.group(2)):
        raise _unsatisfiable(f"unsupported Range {header!r}: use one range, 'bytes=START-END'")
    if not m.group(1):  # suffix: the last n bytes
        n = int(m.group(2))
        if n == 0 or size == 0:
            raise _unsatisfiable(f"Range {header!r} selects no bytes of a {size}-byte payload")
        return max(0, size - n), size - 1
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        raise _unsatisfiable(f"Range {header!r} is outside the {size}-byte payload")
    return start, min(end, size - 1)


def _int_param(value: str | None, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise StoreError(ErrorKind.INVALID, f"{name} must be an integer version, got {value!r}", name) from None


def create_app(
    store: VersionStore,
    token: str | Access,
    read_token: str | None = None,
    announcer: Announcer | None = None,
    metrics: WeightServerMetrics | None = None,
    assets: AssetStore | None = None,
    watchdog: LoopWatchdog | None = None,
    peers: PeerDirectory | None = None,
    identities: WorkerIdentityVerifier | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> FastAPI:
    """The app over a store; `token` guards uploads, `read_token` (if set) guards reads, or `token` is the whole
    Access (the job's role tokens: access.py); `assets`: the model's assets (default: `<data-dir>/assets`)."""
    access = token if isinstance(token, Access) else Access.tokens(token, read_token)
    metrics = metrics or WeightServerMetrics()
    assets = assets if assets is not None else AssetStore(store.root / "assets")
    app = FastAPI(title="rlboost weight-server", docs_url=None, redoc_url=None, openapi_url=None)
    peers = peers if peers is not None else PeerDirectory()
    peer_access = PeerAccess(identities, metrics)
    app.state.store, app.state.metrics, app.state.peers = store, metrics, peers
    app.add_middleware(BodyDeadline, timeout_s=body_timeout_s, on_close=metrics.slow_closed.labels("body").inc)

    def refresh_gauges() -> None:
        metrics.versions_held.set(len(store.versions()))
        metrics.compacted_held.set(store.compacted_count())
        metrics.compacted_bytes.set(store.compacted_bytes())
        metrics.bytes_on_disk.set(store.bytes_on_disk())

    refresh_gauges()
    store.on_compacted_evicted = metrics.compacted_evictions.inc

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, err: StoreError) -> JSONResponse:
        status = HTTP_STATUS[err.kind]
        metrics.rejected.labels(str(status)).inc()
        return _error(status, err.message, err.field)

    def check_read(request: Request) -> None:
        access.check_read(_bearer(request))

    @app.get(routes.HEALTHZ)
    async def healthz() -> Response:
        if watchdog is not None and not watchdog.healthy():  # the loop was blocked: answered late, and 503
            return Response(f"event loop blocked for {watchdog.lag_s():.1f}s\n", 503, media_type="text/plain")
        return Response("ok\n", media_type="text/plain")

    @app.get(routes.METRICS)
    async def prometheus() -> Response:
        refresh_gauges()
        body = generate_latest(metrics.registry) + generate_latest(gc_pauses.registry)  # + the process's pauses
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get(routes.api(routes.VERSIONS))
    async def versions(request: Request) -> VersionList:
        check_read(request)
        held = store.versions()
        return VersionList(latest=held[-1] if held else None, versions=held)

    @app.get(routes.api(routes.MANIFEST))
    async def manifest(version: int, request: Request) -> Manifest:
        check_read(request)
        return store.manifest(version, request.query_params.get("kind") or None)

    @app.put(routes.api(routes.PEER))
    async def register_peer(worker: str, request: Request) -> Response:
        check_read(request)  # a worker's token: what it would need to pull the payloads it serves
        _check_worker_id(worker)
        peer_access.check(request, worker)  # ...and the proof that it is this worker (issue 31)
        registration = _parse(PeerRegistration, await _read_bounded(request, MAX_PEER_BODY, "peer registration"))
        try:
            peers.register(worker, registration, time.monotonic())
        except DirectoryFull as err:
            metrics.peer_refused.labels("full").inc()
            raise StoreError(ErrorKind.TOO_LARGE, f"{err}; try again once workers left or expired", "worker") from None
        metrics.peers.set(len(peers.peers))
        return Response(status_code=204)

    @app.delete(routes.api(routes.PEER))
    async def leave_peer(worker: str, request: Request) -> Response:
        check_read(request)
        _check_worker_id(worker)
        peer_access.check(request, worker)
        peers.leave(worker)
        metrics.peers.set(len(peers.peers))
        return Response(status_code=204)

    @app.post(routes.api(routes.SOURCES))
    async def sources(request: Request) -> SourceList:
        check_read(request)
        ask = _parse(SourcesRequest, await _read_bounded(request, MAX_PEER_BODY, "sources request"))
        peer_access.check(request, ask.worker)  # a puller asks as itself: its place in the chain is its own
        found = peers.sources(ask.worker, ask.path, time.monotonic())
        metrics.peers.set(len(peers.peers))
        metrics.source_answers.labels("relay" if found.relay else "peers").inc()
        return found

    @app.post(routes.api(routes.STALLED))
    async def stalled(request: Request) -> Response:
        check_read(request)
        report = _parse(StalledPeer, await _read_bounded(request, MAX_PEER_BODY, "stalled peer report"))
        peer_access.check(request, report.worker)  # a puller reports as itself
        if peers.report_stalled(report.worker, report.peer):
            metrics.peer_stalled.inc()
            log.info("peer reported stalled", extra={"peer": report.peer, "reporter": report.worker})
        return Response(status_code=204)

    @app.get(routes.api(routes.SYNC))
    async def sync(request: Request) -> list[Manifest]:
        check_read(request)
        q = request.query_params
        a, b = _int_param(q.get("from"), "from"), _int_param(q.get("to"), "to")
        compact = q.get("compact", "1") not in ("0", "false", "no")
        # Off the event loop: building a compacted delta reads and composes the chain.
        return await anyio.to_thread.run_sync(store.sync_plan, a, b, compact)

    @app.get(routes.api(routes.COMPACTED_MANIFEST))
    async def compacted_manifest(base: int, version: int, request: Request) -> Manifest:
        check_read(request)
        return await anyio.to_thread.run_sync(store.compacted, base, version)

    @app.get(routes.api(routes.COMPACTED_PAYLOAD))
    async def compacted_payload(base: int, version: int, request: Request) -> Response:
        check_read(request)
        m = await anyio.to_thread.run_sync(store.compacted, base, version)
        return await _serve(m, store.compacted_payload_path(base, version), request)

    @app.get(routes.api(routes.PAYLOAD))
    async def payload(version: int, request: Request) -> Response:
        check_read(request)
        m = store.manifest(version)
        return await _serve(m, store.payload_path(version), request)

    @app.get(routes.api(routes.KIND_PAYLOAD))
    async def payload_of_kind(version: int, kind: str, request: Request) -> Response:
        check_read(request)
        m = store.manifest(version, kind)
        return await _serve(m, store.payload_path(version, kind), request)

    async def _serve(m: Manifest, path: Path, request: Request) -> Response:
        """A payload file, whole or one Range of it, streamed in blocks (one read when it fits one block); bytes
        counted by sync path."""
        size = m.total_bytes
        range_header = request.headers.get("range")
        if range_header is None:
            start, end, status, extra = 0, size - 1, 200, {}
        else:
            metrics.range_requests.inc()
            try:
                start, end = parse_range(range_header, size)
            except StoreError as err:
                status = HTTP_STATUS[err.kind]
                metrics.rejected.labels(str(status)).inc()
                return _error(status, err.message, err.field, {"Content-Range": f"bytes */{size}"})
            status, extra = 206, {"Content-Range": f"bytes {start}-{end}/{size}"}
        served = metrics.bytes_served.labels(m.sync_path)

        def body():  # sync generator: Starlette runs each step in a worker thread, off the event loop
            for block in store.read_range(m.version, start, end, path):
                served.inc(len(block))
                yield block

        headers = {"Content-Length": str(max(0, end - start + 1)), "Accept-Ranges": "bytes", **extra}
        headers["ETag"] = f'"{m.sha256}"'
        if end - start + 1 <= READ_BLOCK:  # a chunk's range: streamed, it cost a thread trip per block, one more to
            # end the stream and a disconnect-listening task per answer (issue 34's fan-out profile); read at once,
            # it holds no more memory than one streamed block
            data = read_if_cached(path, start, end) or await anyio.to_thread.run_sync(
                lambda: b"".join(store.read_range(m.version, start, end, path))
            )
            served.inc(len(data))
            return Response(data, status_code=status, headers=headers, media_type="application/octet-stream")
        return StreamingResponse(body(), status_code=status, headers=headers, media_type="application/octet-stream")

    def check_upload(request: Request) -> None:
        access.check_upload(_bearer(request))

    @app.get(routes.api(routes.ASSETS))
    async def asset_list(request: Request) -> AssetList:
        check_read(request)
        return assets.list()

    @app.get(routes.api(routes.ASSET))
    async def asset(name: str, request: Request) -> Response:
        check_read(request)
        info = assets.info(name)
        data = await anyio.to_thread.run_sync(assets.path(name).read_bytes)
        return Response(data, media_type="application/octet-stream", headers={"ETag": f'"{info.sha256}"'})

    @app.put(routes.api(routes.ASSET))
    async def upload_asset(name: str, request: Request) -> AssetInfo:
        check_upload(request)
        declared = _int_param(request.headers.get("content-length"), "Content-Length")
        assets.admit(name, declared or 0)  # refused before a byte is read
        data = await _read_bounded(request, MAX_ASSET_BYTES, f"asset {name!r}")
        info = await anyio.to_thread.run_sync(assets.put, name, data)
        log.info("asset uploaded", extra={"asset": name, "bytes": info.size})
        return info

    @app.put(routes.api(routes.VERSION))
    async def upload(version: int, request: Request) -> Manifest:
        check_upload(request)
        h = request.headers
        base = _int_param(h.get(HEADER_BASE_VERSION), HEADER_BASE_VERSION)
        up = store.begin_upload(
            version,
            kind=h.get(HEADER_KIND, "full"),
            checksum=h.get(HEADER_CHECKSUM, ""),
            base_version=base,
            fmt=h.get(HEADER_FORMAT),
            signature=h.get(HEADER_SIGNATURE),
            chunk_bytes=_int_param(h.get(HEADER_CHUNK_BYTES), HEADER_CHUNK_BYTES),
        )
        try:
            result = await _receive(request, up)
        except BaseException:
            store.release(up)
            raise
        metrics.uploads.labels(result.kind).inc()
        metrics.upload_bytes.labels(result.kind).inc(result.total_bytes)
        refresh_gauges()
        log.info(
            "version uploaded",
            extra={
                "version": version,
                "kind": result.kind,
                "bytes": result.total_bytes,
                "base": result.base_version,
                "companion": result.companion,
            },
        )
        if announcer is not None and not result.companion:  # a companion adds no new version: announced already
            event = WeightsAnnounced(version=version, checksum=result.checksum, kind=result.kind)
            if not await announcer.announce(event):
                metrics.announce_failures.inc()
        return result

    return app


def _check_worker_id(worker: str) -> None:
    if not re.fullmatch(WORKER_ID_PATTERN, worker):
        raise StoreError(ErrorKind.INVALID, f"worker id {worker[:64]!r} must match {WORKER_ID_PATTERN}", "worker")


_Body = TypeVar("_Body", bound=BaseModel)


def _parse(model: type[_Body], body: bytes) -> _Body:
    """A JSON body as `model`; a refusal naming the first bad field otherwise."""
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        raise StoreError(ErrorKind.INVALID, f"{where}: {first['msg']}", where) from None


async def _read_bounded(request: Request, limit: int, name: str) -> bytes:
    """The request body, refused (413) as soon as it passes `limit` bytes, whatever Content-Length said."""
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise StoreError(ErrorKind.TOO_LARGE, f"{name} is over {limit} bytes", "Content-Length")
    return bytes(body)


async def _receive(request: Request, up: Upload) -> Manifest:
    """Stream the request body to disk in large blocks, then commit; never holds the whole payload. One block is
    written and hashed (in a worker thread) while the next one is received, so the body keeps flowing."""
    buf, writing = bytearray(), None
    try:
        async for piece in request.stream():
            buf += piece
            if len(buf) >= WRITE_BUFFER:
                data, buf = bytes(buf), bytearray()
                if writing is not None:
                    await writing
                writing = asyncio.ensure_future(anyio.to_thread.run_sync(up.write, data))
        if writing is not None:
            await writing
    finally:
        if writing is not None and not writing.done():  # the client went away: let the write finish, then fail
            await asyncio.wait([writing])
    if buf:
        await anyio.to_thread.run_sync(up.write, bytes(buf))
    return await anyio.to_thread.run_sync(up.commit)
