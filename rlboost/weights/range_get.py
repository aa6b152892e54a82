"""Ranged HTTP/1.1 GETs whose body lands in the caller's buffer: the kernel copies the bytes straight into it.

    reader = RangeReader({"Authorization": "Bearer <token>"}, tls=None, timeout=60.0, keep=6)
    reply = await reader.get_into("http://10.0.3.7:8601/v1/versions/4/payload", start, end, view)
    # reply.status 206: reply.received bytes are in view[:reply.received]; any other status: reply.body says why
    await reader.close()

Why not aiohttp, which the client uses for everything else of the payload path: profiled in a wave of 16 workers
(docs/benchmarks.md, "Peer weight fan-out"), most of a node's CPU went to handling each socket read in Python —
aiohttp's parser feeding its stream reader a bytes object per read, re-arming the read timeout per read, joining
pieces, then a copy of every piece into the payload buffer. Here an `asyncio.BufferedProtocol` hands the kernel a
view of the destination itself (`get_buffer`), so a read is one `recv_into` and a counter: no object, no copy.
The read timeout is a watchdog that looks at the progress once per `timeout`, not a timer moved on every read.

Only what the weight routes need: one `Range`, a 206 with `Content-Length` and a matching `Content-Range` (else a
`RangeConnectionError`, as for a cut connection: the puller retries or asks another source), keep-alive
connections pooled per origin (`keep` idle ones each), TLS through `tls` (an `ssl.SSLContext`), no proxies, no
redirects. A reused connection the server closed while it sat idle is replaced once, transparently.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

HEAD_LIMIT = 64 << 10  # a response's status line and headers; an error body is kept up to the same size
_Origin = tuple[str, str, int]
_EMPTY = memoryview(b"")


class RangeConnectionError(Exception):
    """The connection failed, dropped or stalled, or the answer was not a well-formed ranged one; `received` body
    bytes had arrived in the destination first (a retry resumes after them)."""

    def __init__(self, message: str, received: int = 0) -> None:
        super().__init__(message)
        self.received = received


@dataclass
class RangeReply:
    """A complete answer: `received` body bytes written to the destination (206), or the `body` of any other status."""

    status: int
    reason: str
    received: int = 0
    body: bytes = b""


class _Conn(asyncio.BufferedProtocol):
    """One keep-alive connection, reading one response at a time into the buffer it is given."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        # A memoryview, never the bytearray itself: asyncio's TLS transport fills a BufferedProtocol's buffer one TLS
        # record at a time, the later records into `buf[offset:]`, which of a bytearray is a copy (the bytes land
        # in the copy and are lost; buffer_updated then counts stale bytes). A head arriving with the first body
        # records (a server that answers in one write) brought those records' bytes wrong.
        self._scratch = memoryview(bytearray(HEAD_LIMIT))
        self._head = bytearray()
        self._dest = _EMPTY
        self._mode = "idle"  # head (status and headers) | body (into dest) | error (an error body, kept)
        self._want = self.got = self.seen = 0  # body bytes expected, body bytes received; all bytes received
        self._done: asyncio.Future[RangeReply] | None = None
        self._reply = RangeReply(0, "")
        self._start, self.keep_alive, self._to_eof = 0, True, False
        self.origin: _Origin = ("", "", 0)  # the pool this connection goes back to

    def request(self, head: bytes, start: int, dest: memoryview) -> asyncio.Future[RangeReply]:
        assert self.transport is not None and self._mode == "idle"
        self._head.clear()
        self._dest, self._start, self._mode, self.got, self.seen = dest, start, "head", 0, 0
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(head)
        return self._done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._mode == "body":
            return self._dest[self.got : self._want]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.seen += nbytes
        if self._mode == "body":
            self.got += nbytes
            if self.got == self._want:
                self._finish()
        elif self._mode == "idle":  # bytes nobody asked for: this connection cannot be trusted with a next request
            self.abort()
        else:
            self._head += self._scratch[:nbytes]
            self._on_head_bytes()

    def _on_head_bytes(self) -> None:
        if self._mode == "error":
            if len(self._head) >= self._want and not self._to_eof:
                self._reply.body = bytes(self._head[: self._want])
                self._finish()
            elif len(self._head) > HEAD_LIMIT:
                self._fail("an error body longer than 64 KiB")
            return
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > HEAD_LIMIT:
                self._fail("response headers longer than 64 KiB")
            return
        rest = self._head[end + 4 :]
        try:
            self._parse_head(bytes(self._head[:end]))
        except ValueError as err:
            self._fail(str(err))
            return
        self._head = rest
        if self._mode == "body":
            if len(rest) > self._want:
                self._fail("more body bytes than Content-Length")
                return
            self._dest[: len(rest)] = rest
            self.got = len(rest)
            if self.got == self._want:
                self._finish()
        else:
            self._on_head_bytes()

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        self._reply = RangeReply(int(code), reason)
        self.keep_alive = version == "HTTP/1.1" and fields.get("connection", "").lower() != "close"
        length = fields.get("content-length")
        if self._reply.status != 206:
            self._mode, self._to_eof = "error", length is None or "chunked" in fields.get("transfer-encoding", "")
            self._want, self.keep_alive = (int(length) if length and length.isdigit() else HEAD_LIMIT), False
            return
        if length is None or not length.isdigit() or int(length) > len(self._dest):
            raise ValueError(f"a 206 answer needs a Content-Length within the range (got {length!r})")
        if not fields.get("content-range", "").startswith(f"bytes {self._start}-"):
            raise ValueError(f"Content-Range {fields.get('content-range')!r} is not the range asked for")
        self._mode, self._want = "body", int(length)

    def _finish(self) -> None:
        self._reply.received = self.got if self._reply.status == 206 else 0
        self._mode, self._dest = "idle", _EMPTY  # the caller's buffer is not held past its answer
        if self._done is not None and not self._done.done():
            self._done.set_result(self._reply)

    def _fail(self, message: str) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(RangeConnectionError(message, self.got))
        self.abort()

    def abort(self) -> None:
        self.closed, self._dest = True, _EMPTY
        if self.transport is not None:
            self.transport.abort()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._mode == "error" and self._to_eof:  # an error body that ends with the connection
            self._reply.body = bytes(self._head[:HEAD_LIMIT])
            self._finish()
        elif self._done is not None and not self._done.done():
            why = f"{type(exc).__name__}: {exc}" if exc else "closed by the other end"
            self._done.set_exception(RangeConnectionError(f"connection lost ({why})", self.got))


class RangeReader:
    """Pooled connections and ranged GETs into caller-owned buffers; use in one event loop, `close` at the end."""

    def __init__(
        self,
        headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
        timeout: float = 60.0,
        keep: int = 6,
    ) -> None:
        """`timeout`: seconds without a byte (and to connect, at most 10) before the request fails."""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._extra, self._tls, self.timeout, self.keep = extra, tls, timeout, keep
        self._idle: dict[_Origin, list[_Conn]] = {}

    async def get_into(self, url: str, start: int, end: int, dest: memoryview) -> RangeReply:
        """GET bytes start..end (inclusive) of `url` into `dest` (at least end - start + 1 bytes, writable)."""
        parts = urlsplit(url)
        origin = (parts.scheme, parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = (
            f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nRange: bytes={start}-{end}\r\n"
            f"Accept-Encoding: identity\r\n{self._extra}\r\n"
        ).encode("latin-1")
        conn, reused = await self._connection(origin)
        try:
            return await self._exchange(conn, head, start, dest)
        except RangeConnectionError:
            if not (reused and conn.seen == 0):
                raise
        # a pooled connection the server had closed while it was idle (its keep-alive ran out): once more, afresh
        conn, _ = await self._connection(origin, fresh=True)
        return await self._exchange(conn, head, start, dest)

    async def _exchange(self, conn: _Conn, head: bytes, start: int, dest: memoryview) -> RangeReply:
        done = conn.request(head, start, dest)
        try:
            while True:
                before = conn.seen
                finished, _ = await asyncio.wait([done], timeout=self.timeout)
                if finished:
                    break
                if conn.seen == before:
                    raise RangeConnectionError(f"no byte for {self.timeout:.0f} s", conn.got)
            reply = done.result()
        except BaseException:
            conn.abort()  # cancelled or failed mid-answer: the connection's state is unknown
            with contextlib.suppress(BaseException):
                done.exception() if done.done() else done.cancel()
            raise
        self._release(conn)
        return reply

    async def _connection(self, origin: _Origin, fresh: bool = False) -> tuple[_Conn, bool]:
        idle = self._idle.get(origin, [])
        while idle and not fresh:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn, True
        scheme, host, port = origin
        tls = (self._tls or ssl.create_default_context()) if scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Conn, host, port, ssl=tls), timeout=min(self.timeout, 10.0)
            )
        except (OSError, TimeoutError, ssl.SSLError) as err:
            raise RangeConnectionError(f"cannot connect to {host}:{port} ({type(err).__name__}: {err})") from None
        conn.origin = origin
        return conn, False

    def _release(self, conn: _Conn) -> None:
        if conn.closed or not conn.keep_alive or conn.transport is None:
            conn.abort()
            return
        idle = self._idle.setdefault(conn.origin, [])
        if len(idle) >= self.keep:
            conn.abort()
        else:
            idle.append(conn)

    async def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
