"""Deadlines for slow clients (issue 31 item 6): the audit held 600 half-sent HTTP requests open on the weight-server.

- Headers: a connection must deliver a whole request header within `--header-timeout` seconds of opening (or of its
  previous response), however it trickles the bytes: uvicorn's keep-alive timer restarts on every byte, so a
  client sending one byte every few seconds was never closed. `HeaderDeadlineProtocol` (uvicorn's httptools
  protocol) closes the connection at the deadline unless a whole header came in.
- Bodies: while the app waits for body bytes (an upload streaming to disk), each wait may last `--body-timeout`
  seconds; past it the request is answered 408 naming the field, and the connection closed. The time the app
  spends writing (not waiting) does not count, so a large upload to a slow disk is never cut.

Both are counted in rlboost_weights_slow_requests_closed_total{phase}.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0


def header_deadline_protocol(timeout_s: float, on_close: Callable[[], None]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol (the fast parser: h11 capped pulls at ~50 MB/s), closing a connection that has
    not delivered a whole request header `timeout_s` after it opened or after its previous response (pass it as
    uvicorn.Config(http=...))."""

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()  # a whole header: the request is in (its body has the body deadline)
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's header is due within the deadline too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(timeout_s, self._late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _late(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                on_close()
                self.transport.close()

    return HeaderDeadlineProtocol


class BodyTimeout(Exception):  # noqa: N818 (raised from the app's receive; answered 408)
    """The client sent no body bytes for the body timeout while the app waited for them."""


class BodyDeadline:
    """ASGI middleware: each wait of the app for request body bytes lasts at most `timeout_s` (then 408)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], timeout_s: float, on_close) -> None:
        self.app, self.timeout_s, self.on_close = app, timeout_s, on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def timed_receive() -> Message:
            try:
                return await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                raise BodyTimeout from None

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, watched_send)
        except BodyTimeout:
            self.on_close()
            if not started:
                await _refuse(send, f"request body: no bytes for {self.timeout_s:g}s (--body-timeout)")


async def _refuse(send: Send, message: str) -> None:
    body = json.dumps({"error": message, "field": "body"}).encode()
    headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 408, "headers": headers})
    await send({"type": "http.response.body", "body": body})
