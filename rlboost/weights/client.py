"""Async client of the weight-server (torch-free): list, plan, pull over several ranged streams, upload.

    async with WeightClient("http://127.0.0.1:8600", token=tok, streams=4) as wc:
        await wc.upload(0, payload, kind="full", checksum=digest)
        data = await wc.pull(0)            # every chunk's sha256 verified (chunks tile the payload)
        await wc.upload_asset("config.json", text)  # the model's config, tokenizer... (before version 0)
        await wc.pull_assets(model_dir)    # every asset, sha256 verified (signed, with a verifier), written atomically

With a `verifier` (rlboost.weights.signing.ManifestVerifier: the job's public key) every manifest a pull or a
sync plan brings is checked against the trainer's signature before a byte is fetched, sync plans leave out the
server-composed compacted deltas, and a chunk that never matches its signed sha256 is refused
(WeightsRejectedError); uploads carry the trainer's signature when given one.

A pull fetches the manifest's chunks over `streams` concurrent `Range` requests. A chunk whose
connection drops is retried with exponential backoff (bounded), resuming from the bytes of that
chunk already received; a chunk whose sha256 does not match is fetched again from its start.

Three HTTP paths, on purpose: httpx for the small JSON calls, aiohttp for uploads, and rlboost.weights.range_get
for payload reads. httpx's pure-Python HTTP/1.1 path reads 64 KiB at a time through four layers and cost ~6 ms of
CPU per MB here (a single stream capped at ~160 MB/s, whatever the link); aiohttp's C parser reading 1 MiB pieces
pulled ~950 MB/s on one stream at ~0.7 ms per MB, but still made an object per socket read and copied every piece
into the payload; range_get receives into the payload buffer itself (bench: docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import httpx
from pydantic import TypeAdapter
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from rlboost.weights.peer_serve import CachedPayload, PayloadCache
from rlboost.weights.range_get import RangeConnectionError, RangeReader
from rlboost.weights.signing import ASSET_MANIFEST, ManifestVerifier, WeightsRejectedError
from rlboost.wire import weight_routes as routes
from rlboost.wire.peers_io import HEADER_IDENTITY, PeerRegistration, Source, SourceList, SourcesRequest, StalledPeer
from rlboost.wire.weights_io import (
    HEADER_BASE_VERSION,
    HEADER_CHECKSUM,
    HEADER_CHUNK_BYTES,
    HEADER_FORMAT,
    HEADER_KIND,
    HEADER_SIGNATURE,
    AssetInfo,
    AssetList,
    ChunkInfo,
    Manifest,
    VersionList,
)

UPLOAD_BLOCK = 1 << 20


class WeightServerError(Exception):
    """The weight-server refused a request, or a pull could not be completed and verified."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"weight-server: {message} (HTTP {status})" if status else f"weight-server: {message}")
        self.status, self.message, self.field = status, message, field


class _RetryableError(Exception):
    """A chunk fetch that failed in a way worth retrying (connection drop, short read, bad sha256)."""


class _ChunkMismatchError(_RetryableError):
    """A chunk whose bytes arrived whole but do not match the manifest's sha256."""


class _ConnectionLostError(_RetryableError):
    """The connection failed or dropped (a peer that died: not worth asking again during this pull)."""


@dataclass
class PullStats:
    """What the last pull did: requests sent, retries, and the offsets retries resumed from."""

    requests: int = 0
    retries: int = 0
    resumed_offsets: list[int] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    peer_bytes: int = 0  # payload bytes that came from peers (the rest from the weight-server)
    peer_failures: int = 0  # chunk fetches from a peer that failed and went to another source


class PeerSources(Protocol):
    """What a pull needs of peer fan-out: where to fetch a payload from, and the cache that keeps each verified
    chunk for other peers. rlboost.weights.fanout.PeerFanout is one, and attaches itself as `WeightClient.fanout`."""

    cache: PayloadCache

    async def sources(self, manifest: Manifest) -> list[Source]:
        """The payload's sources, best first (the weight-server last); [] when the directory cannot be asked."""
        ...

    def held_changed(self) -> None:
        """A payload became whole (peers may be told now)."""
        ...

    def peer_stalled(self, source: Source) -> None:
        """A peer sent no byte within the peer timeout or could not be reached (the directory may be told, so
        that new workers do not wait on it too)."""
        ...


# A peer that sends no byte for this long is left for the chunk's next source (the weight-server is always the last):
# a peer frozen or gone without a TCP reset (a VM that vanished) held each of its pullers for the server's whole
# 60 s read timeout (issue 34: a frozen spot worker stalled two workers' first pulls, and the job's step 0, 60 s).
PEER_STALL_S = 10.0
# ...and is not asked again for this long (the directory forgets a peer 30 s after its last heartbeat: until then it
# still lists one that vanished, and every payload's pull would wait on it again).
PEER_DOWN_S = 30.0


@dataclass
class _PeerPull:
    """One pull's peers: its sources (best first), those that failed to connect, the cache entry it fills."""

    peers: list[Source]
    down: set[str]
    kept: CachedPayload | None


_SYNC_PLAN = TypeAdapter(list[Manifest])


def parse_sync_plan(body: bytes) -> list[Manifest]:
    """The manifests of a /sync answer; pydantic's ValidationError for anything but a JSON list of manifests."""
    return _SYNC_PLAN.validate_json(body)


def _raise_for(resp: httpx.Response) -> None:
    _raise_status(resp.status_code, resp.content, resp.reason_phrase)


def _raise_status(status: int, body: bytes, reason: str | None) -> None:
    """WeightServerError with the server's own message (its JSON `error` and `field`) for a status >= 400."""
    if status < 400:
        return
    try:
        doc = json.loads(body)
        message, fld = (str(doc.get("error", doc)), doc.get("field")) if isinstance(doc, dict) else (str(doc), None)
    except ValueError:
        message, fld = body.decode(errors="replace").strip() or (reason or ""), None
    raise WeightServerError(status, message, fld)


class WeightClient:
    """Talks to one weight-server; use as `async with` (or call `aclose()`)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        streams: int = 4,
        timeout: float = 60.0,
        retries: int = 6,
        backoff_max: float = 2.0,
        ca: bytes | None = None,
        verifier: ManifestVerifier | None = None,
        peer_timeout: float = PEER_STALL_S,
    ) -> None:
        """`token`: sent as `Authorization: Bearer` on every request (reads and uploads); `ca`: the job CA's PEM,
        which an https server's certificate must chain to (None: the system's trust store); `peer_timeout`: seconds
        without a byte from a peer before its chunk is fetched elsewhere (at most `timeout`)."""
        if streams < 1:
            raise ValueError(f"streams must be >= 1, got {streams}")
        self.streams, self.retries, self.backoff_max = streams, retries, backoff_max
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._base_url, self._headers, self._timeout = base_url.rstrip("/"), headers, timeout
        self._tls = ssl.create_default_context(cadata=ca.decode()) if ca else None
        self._bulk_http: aiohttp.ClientSession | None = None  # uploads; made on first use, in the event loop
        self._range_reader: RangeReader | None = None  # payload reads, straight into the pull's buffer
        self._peer_reader: RangeReader | None = None  # the same from peers, which may stall no longer than this
        self._peer_timeout = min(peer_timeout, timeout)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            verify=self._tls if self._tls is not None else True,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2),
        )
        self.last_pull = PullStats()
        self.verifier = verifier  # None: manifests are taken as served (no job credentials)
        self.fanout: PeerSources | None = None  # peer sources and the cache peers are served from (fanout.py)
        self.on_peer_rejected: Callable[[str], None] | None = None  # called with a peer's URL when it lied
        self.bad_peers: set[str] = set()  # peers that served bytes that are not the manifest's: never asked again
        self.down_peers: dict[str, float] = {}  # peer URL -> until when it is not asked (it dropped or stalled)

    async def __aenter__(self) -> WeightClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._bulk_http is not None:
            await self._bulk_http.close()
        for reader in (self._range_reader, self._peer_reader):
            if reader is not None:
                await reader.close()

    def _ranges(self, base_url: str) -> RangeReader:
        """The weight-server's reader, or (any other base URL) the peers' one, with the shorter stall timeout."""
        if base_url != self._base_url:
            if self._peer_reader is None:
                self._peer_reader = RangeReader(self._headers, self._tls, self._peer_timeout, keep=self.streams + 2)
            return self._peer_reader
        if self._range_reader is None:
            self._range_reader = RangeReader(self._headers, self._tls, self._timeout, keep=self.streams + 2)
        return self._range_reader

    def _bulk(self) -> aiohttp.ClientSession:
        if self._bulk_http is None:
            self._bulk_http = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(
                    limit=self.streams + 2, ssl=self._tls if self._tls is not None else True
                ),
                timeout=aiohttp.ClientTimeout(connect=min(self._timeout, 10.0), sock_read=self._timeout),
                auto_decompress=False,  # payload bytes are hashed as sent
            )
        return self._bulk_http

    async def _get(self, path: str, **kwargs: object) -> httpx.Response:
        try:
            resp = await self._http.get(routes.api(path), **kwargs)
        except httpx.TransportError as err:
            raise WeightServerError(0, f"cannot reach {self._http.base_url}: {err!r}") from None
        _raise_for(resp)
        return resp

    # ---- reads -------------------------------------------------------------------------------
    async def versions(self) -> VersionList:
        return VersionList.model_validate_json((await self._get(routes.VERSIONS)).content)

    async def manifest(self, version: int, kind: str | None = None) -> Manifest:
        """A version's manifest; with `kind` ('full' or 'delta') its payload of that kind (a snapshot version
        may also hold the delta from the version before, as a companion)."""
        params = {"kind": kind} if kind else None
        return Manifest.model_validate_json((await self._get(routes.manifest(version), params=params)).content)

    async def sync_plan(
        self, from_version: int | None, to_version: int | None = None, compact: bool = True
    ) -> list[Manifest]:
        """Manifests to apply in order to go from `from_version` (None: nothing held) to `to_version` (None: latest).

        The server picks the fewest bytes among the delta chain, a compacted delta (when `compact`),
        and the full snapshot + deltas; a manifest's `sync_path` says which kind of payload it is.
        """
        params = {k: str(v) for k, v in (("from", from_version), ("to", to_version)) if v is not None}
        if not compact or self.verifier is not None:  # a compacted delta carries no trainer signature
            params["compact"] = "0"
        plan = parse_sync_plan((await self._get(routes.SYNC, params=params)).content)
        if self.verifier is not None:
            self.verifier.check_plan(plan, from_version, to_version)
        return plan

    async def compacted(self, base: int, version: int) -> Manifest:
        """The manifest of the server's compacted base->version delta (built on first request)."""
        return Manifest.model_validate_json((await self._get(routes.compacted_manifest(base, version))).content)

    # ---- peer fan-out (the weight-server's source directory: rlboost.weights.peers) -------------
    async def register_peer(self, worker: str, registration: PeerRegistration, identity: str = "") -> None:
        """Register (or heartbeat) this worker as a peer that serves the payloads it holds; `identity`: its
        identity proof (rlboost.wire.peers_io.HEADER_IDENTITY), which the job's weight-server requires."""
        await self._call("PUT", routes.peer(worker), registration.model_dump_json(), identity)

    async def leave_peer(self, worker: str, identity: str = "") -> None:
        await self._call("DELETE", routes.peer(worker), identity=identity)

    async def peer_sources(self, worker: str, path: str, identity: str = "") -> SourceList:
        """Where `worker` should fetch the payload at `path`: peers near it first, the weight-server last."""
        body = SourcesRequest(worker=worker, path=path).model_dump_json()
        return SourceList.model_validate_json((await self._call("POST", routes.SOURCES, body, identity)).content)

    async def report_stalled(self, worker: str, peer: str, identity: str = "") -> None:
        """Tell the directory that `peer` sent `worker` nothing within its peer timeout (or could not be reached):
        it is offered to no one until it heartbeats again."""
        await self._call("POST", routes.STALLED, StalledPeer(worker=worker, peer=peer).model_dump_json(), identity)

    async def _call(self, method: str, path: str, body: str | None = None, identity: str = "") -> httpx.Response:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if identity:
            headers[HEADER_IDENTITY] = identity
        try:
            resp = await self._http.request(method, routes.api(path), content=body, headers=headers)
        except httpx.TransportError as err:
            raise WeightServerError(0, f"cannot reach {self._http.base_url}: {err!r}") from None
        _raise_for(resp)
        return resp

    async def wait_for_version(self, version: int, timeout: float, interval: float = 0.1) -> VersionList:
        """Poll until the latest version is >= `version`; TimeoutError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                held = await self.versions()
                if held.latest is not None and held.latest >= version:
                    return held
            except WeightServerError as err:
                if err.status:  # the server answered with a refusal: waiting will not help
                    raise
            if time.monotonic() >= deadline:
                raise TimeoutError(f"weight version {version} did not appear within {timeout:.0f}s")
            await asyncio.sleep(interval)  # polling interval of a client loop, not test synchronisation

    async def pull(self, version: int | Manifest) -> bytearray:
        """The payload of a version, fetched in chunks over `streams` connections and verified. A bytearray, not
        a copy of it as bytes: a snapshot is the size of the model (delta apply and safetensors take either)."""
        m = version if isinstance(version, Manifest) else await self.manifest(version)
        if self.verifier is not None:  # before a byte is fetched; the chunks' sha256s are then signed ones
            self.verifier.check(m, None if isinstance(version, Manifest) else version)
        started = time.monotonic()
        self.last_pull = stats = PullStats()
        buf = bytearray(m.total_bytes)
        gate = asyncio.Semaphore(self.streams)
        peers: list[Source] = []
        kept: CachedPayload | None = None
        fanning = self.fanout is not None and _chunks_tile(m)  # each chunk checked alone: it may come from anyone
        if fanning:
            with contextlib.suppress(OSError):  # no room to keep it for peers: still pulled for ourselves
                # before asking for sources: the directory names this worker to the pullers that ask after it at
                # once, and a peer without the entry answers 404 (they would take those chunks from the server)
                kept = self.fanout.cache.begin(m)
        try:
            if fanning:
                peers = [s for s in await self.fanout.sources(m) if s.url and s.url not in self.bad_peers]
            now = time.monotonic()
            fanned = _PeerPull(peers, {url for url, until in self.down_peers.items() if until > now}, kept)
            await asyncio.gather(*(self._fetch_chunk(m, c, buf, stats, gate, fanned) for c in m.chunks))
            self.down_peers = {url: until for url, until in self.down_peers.items() if until > now}
        except BaseException:
            if kept is not None:
                kept.abort()
            raise
        if kept is not None:
            kept.finish()
            self.fanout.held_changed()
        if not _chunks_tile(m):  # then every byte was checked by its chunk's sha256; else check the whole
            whole = await asyncio.to_thread(lambda: hashlib.sha256(buf).hexdigest())
            if whole != m.sha256:
                message = f"version {m.version}: payload sha256 does not match its manifest"
                raise WeightsRejectedError("payload", message) if self.verifier else WeightServerError(0, message)
        stats.bytes, stats.seconds = len(buf), time.monotonic() - started
        return buf

    async def _fetch_chunk(
        self,
        m: Manifest,
        chunk: ChunkInfo,
        buf: bytearray,
        stats: PullStats,
        gate: asyncio.Semaphore,
        fanned: _PeerPull,
    ) -> None:
        """Fetch one chunk from the peers (each tried once), else from the weight-server; keep it for other peers."""
        if not await self._chunk_from_peers(m, chunk, buf, stats, gate, fanned):
            await self._chunk_from_server(m, chunk, buf, stats, gate, fanned.kept)

    async def _chunk_from_peers(
        self,
        m: Manifest,
        chunk: ChunkInfo,
        buf: bytearray,
        stats: PullStats,
        gate: asyncio.Semaphore,
        fanned: _PeerPull,
    ) -> bool:
        """Whether a peer served the chunk's exact bytes. A peer that fails costs this chunk a try elsewhere; one
        that cannot be reached is skipped for the rest of the pull; one whose bytes are not the manifest's is
        reported (on_peer_rejected) and never asked again."""
        for source in _rotate(fanned.peers, chunk.index):
            if source.url in fanned.down or source.url in self.bad_peers:
                continue
            held = [0]
            try:
                async with gate:
                    await self._fetch_from(m, chunk, buf, held, stats, source.url)
            except _ConnectionLostError:
                stats.peer_failures += 1
                if source.url not in fanned.down and self.fanout is not None and source.worker:
                    self.fanout.peer_stalled(source)  # once per pull: new workers skip it too (issue 34)
                fanned.down.add(source.url)
                self.down_peers[source.url] = time.monotonic() + PEER_DOWN_S  # later pulls skip it too
                continue
            except (_RetryableError, WeightServerError):  # 503: it does not hold the chunk (yet); 4xx: refused
                stats.peer_failures += 1
                continue
            if await _chunk_matches(buf, chunk, fanned.kept):
                stats.peer_bytes += chunk.length
                return True
            stats.peer_failures += 1
            self.bad_peers.add(source.url)
            if self.on_peer_rejected is not None:
                self.on_peer_rejected(source.url)
        return False

    async def _chunk_from_server(
        self,
        m: Manifest,
        chunk: ChunkInfo,
        buf: bytearray,
        stats: PullStats,
        gate: asyncio.Semaphore,
        kept: CachedPayload | None,
    ) -> None:
        """Fetch one chunk (holding one of the `streams` slots) and verify it (slot released: the next chunk's
        bytes flow while this one is hashed), retrying with backoff and resuming after the bytes received; keep it
        for peers in `kept`."""
        held = [0]  # bytes of this chunk already in buf, updated as they arrive; a retry resumes after them
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retries),
            wait=wait_exponential(multiplier=0.05, max=self.backoff_max),
            retry=retry_if_exception_type(_RetryableError),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1:
                        stats.retries += 1
                        if held[0]:
                            stats.resumed_offsets.append(chunk.offset + held[0])
                    async with gate:
                        await self._fetch_from(m, chunk, buf, held, stats, self._base_url)
                    if not await _chunk_matches(buf, chunk, kept):
                        held[0] = 0
                        raise _ChunkMismatchError(f"chunk {chunk.index} sha256 mismatch")
        except _RetryableError as err:
            message = (
                f"version {m.version} ({m.sync_path}) chunk {chunk.index}: gave up after {self.retries} tries ({err})"
            )
            if self.verifier is not None and isinstance(err, _ChunkMismatchError):
                raise WeightsRejectedError("payload", f"{message}: not the bytes the trainer signed") from None
            raise WeightServerError(0, message) from None

    async def _fetch_from(
        self, m: Manifest, chunk: ChunkInfo, buf: bytearray, held: list[int], stats: PullStats, base_url: str
    ) -> None:
        """Fetch the chunk's bytes after the `held[0]` already received into buf from `base_url` (the weight-server
        or a peer: the same routes), advancing `held[0]`."""
        start, end = chunk.offset + held[0], chunk.offset + chunk.length - 1
        if start > end:
            return
        stats.requests += 1
        url = base_url + routes.api(m.payload_path)  # as httpx joins base_url and path
        view = memoryview(buf)[start : end + 1]
        try:
            reply = await self._ranges(base_url).get_into(url, start, end, view)
        except RangeConnectionError as err:  # dropped connection, timeout, truncated or malformed answer
            held[0] += err.received
            raise _ConnectionLostError(str(err)) from None
        finally:
            view.release()
        held[0] += reply.received
        if reply.status >= 500:
            raise _RetryableError(f"HTTP {reply.status}")
        if reply.status != 206:
            _raise_status(reply.status, reply.body, reply.reason)
            raise WeightServerError(reply.status, f"expected 206 for a ranged read, got {reply.status}")
        if held[0] < chunk.length:
            raise _RetryableError(f"short read: {held[0]} of {chunk.length} bytes")

    # ---- writes ------------------------------------------------------------------------------
    async def upload(
        self,
        version: int,
        payload: bytes | bytearray | memoryview | str | Path,
        kind: str = "full",
        checksum: str = "",
        base_version: int | None = None,
        fmt: str | None = None,
        signature: str | None = None,
        chunk_bytes: int | None = None,
    ) -> Manifest:
        """PUT a version (bytes, or a file path streamed from disk); returns the server's manifest. A `signature`
        (rlboost.weights.signing.ManifestSigner) is of the manifest computed with `chunk_bytes` chunks."""
        headers = {HEADER_KIND: kind, HEADER_CHECKSUM: checksum}
        if signature:
            headers[HEADER_SIGNATURE] = signature
        if chunk_bytes is not None:
            headers[HEADER_CHUNK_BYTES] = str(chunk_bytes)
        if base_version is not None:
            headers[HEADER_BASE_VERSION] = str(base_version)
        if fmt:
            headers[HEADER_FORMAT] = fmt
        if isinstance(payload, str | Path):
            path = Path(payload)
            headers["Content-Length"] = str(path.stat().st_size)
            content: AsyncIterator[bytes] | AsyncIterator[memoryview] = _file_blocks(path)
        else:  # in blocks: handed over whole, a snapshot was copied twice on its way to the socket
            headers["Content-Length"] = str(memoryview(payload).nbytes)
            content = _memory_blocks(memoryview(payload).cast("B"))
        url = self._base_url + routes.api(routes.version(version))
        try:
            async with self._bulk().put(url, data=content, headers=headers) as resp:
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as err:
            raise WeightServerError(0, f"upload of version {version} failed: {err!r}") from None
        _raise_status(resp.status, body, resp.reason)
        return Manifest.model_validate_json(body)

    # ---- model assets ------------------------------------------------------------------------
    async def assets(self) -> AssetList:
        """The model's assets the server holds (config, tokenizer, chat template...), with sizes and sha256s."""
        return AssetList.model_validate_json((await self._get(routes.ASSETS)).content)

    async def asset(self, info: AssetInfo) -> bytes:
        """One asset's bytes, checked against its sha256."""
        data = (await self._get(routes.asset(info.name))).content
        if hashlib.sha256(data).hexdigest() != info.sha256:
            message = f"asset {info.name}: its bytes do not match their sha256"
            raise WeightsRejectedError("asset", message) if self.verifier else WeightServerError(0, message)
        return data

    async def pull_assets(self, model_dir: str | Path) -> list[Path]:
        """Write every asset into `model_dir` (each to a temporary file renamed into place); returns the paths.
        With a verifier, only the assets the trainer's signed asset manifest names, each checked against its
        signed sha256 (WeightsRejectedError before anything is written)."""
        root = Path(model_dir)
        listed = {a.name: a for a in (await self.assets()).assets}
        signed_list = listed.pop(ASSET_MANIFEST, None)
        if self.verifier is not None:
            listed = await self._signed_assets(listed, signed_list)
        fetched = [(info, await self.asset(info)) for info in listed.values()]
        root.mkdir(parents=True, exist_ok=True)
        written = []
        for info, data in fetched:
            tmp = root / f".{info.name}.tmp"
            await asyncio.to_thread(tmp.write_bytes, data)
            await asyncio.to_thread(tmp.replace, root / info.name)
            written.append(root / info.name)
        return written

    async def _signed_assets(self, listed: dict[str, AssetInfo], signed_list: AssetInfo | None) -> dict[str, AssetInfo]:
        """The assets the trainer's signed asset manifest names, with its sha256s (not the server's)."""
        assert self.verifier is not None
        sha256s = self.verifier.check_assets(await self.asset(signed_list) if signed_list else None)
        missing = sorted(set(sha256s) - set(listed))
        if missing:
            raise WeightsRejectedError("asset", f"the weight-server lacks the signed model assets {missing}")
        # each fetched asset is then checked against the signed sha256, whatever the server lists
        return {name: AssetInfo(name=name, size=listed[name].size, sha256=h) for name, h in sha256s.items()}

    async def upload_asset(self, name: str, data: bytes) -> AssetInfo:
        """PUT one model asset (needs the token); the same bytes again are accepted, other bytes refused."""
        try:
            resp = await self._http.put(routes.api(routes.asset(name)), content=data)
        except httpx.TransportError as err:
            raise WeightServerError(0, f"upload of asset {name} failed: {err!r}") from None
        _raise_for(resp)
        return AssetInfo.model_validate_json(resp.content)


async def _memory_blocks(view: memoryview) -> AsyncIterator[memoryview]:
    for i in range(0, len(view), UPLOAD_BLOCK):
        yield view[i : i + UPLOAD_BLOCK]


async def _file_blocks(path: Path) -> AsyncIterator[bytes]:
    """A file's bytes in blocks, read in a worker thread so the event loop keeps serving."""
    f = await asyncio.to_thread(open, path, "rb")
    try:
        while block := await asyncio.to_thread(f.read, UPLOAD_BLOCK):
            yield block
    finally:
        f.close()


# Chunks up to this size are hashed (and kept for peers) on the event loop: ~0.15 ms for 256 KiB, less than the trip
# to a worker thread and back (a submit, two thread wake-ups, a wake of the loop) costs per chunk on a busy machine
# (issue 34's fan-out profile). Bigger chunks (the default is 4 MiB) go to a thread, so the other streams keep reading.
INLINE_VERIFY_BYTES = 1 << 20


async def _chunk_matches(buf: bytearray, chunk: ChunkInfo, kept: CachedPayload | None = None) -> bool:
    """Whether the chunk's bytes in buf match its sha256; when they do and `kept` is given, also written to the peer
    cache. One trip off the event loop for both (hashlib and the write release the GIL), so the other streams keep
    reading meanwhile; two trips per chunk showed as a sixth of a relay's Python time in the fan-out profile."""
    view = memoryview(buf)[chunk.offset : chunk.offset + chunk.length]

    def check() -> tuple[bool, OSError | None]:
        if hashlib.sha256(view).hexdigest() != chunk.sha256:
            return False, None
        return True, kept.write(chunk, view) if kept is not None else None

    matches, error = check() if chunk.length <= INLINE_VERIFY_BYTES else await asyncio.to_thread(check)
    if matches and kept is not None:
        kept.written(chunk, error)
    return matches


def _rotate(peers: list[Source], index: int) -> list[Source]:
    """The peers for chunk `index`: those of the best tier rotated by the index (chunks spread over them, fetched
    from several at once), then the others in order."""
    if not peers:
        return []
    best = [p for p in peers if p.tier == peers[0].tier]
    k = index % len(best)
    return [*best[k:], *best[:k], *peers[len(best) :]]


def _chunks_tile(m: Manifest) -> bool:
    """Whether the manifest's chunks cover its payload exactly, in order, without gaps or overlaps: then a payload
    whose every chunk matches its sha256 is the manifest's payload, and a second pass over the whole (~1 GB/s,
    15 s for a 16 GB snapshot) adds nothing."""
    offset = 0
    for c in m.chunks:
        if c.offset != offset or c.length <= 0:
            return False
        offset += c.length
    return offset == m.total_bytes and offset > 0
