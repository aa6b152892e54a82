"""Structured logs and the /metrics + /healthz endpoint every service exposes.

`setup_logging("rollout-manager")` makes every log record one JSON line on stderr;
`serve_http(port, health)` serves Prometheus metrics and a health check from a daemon thread
(for services whose main transport is not HTTP).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, service, logger, msg, plus any `extra=` fields."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def serve_http(port: int, health: Callable[[], bool] = lambda: True, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """Serve GET /metrics (Prometheus) and GET /healthz (200 or 503) on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.startswith("/metrics"):
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif self.path.startswith("/healthz"):
                ok = health()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:  # scrapes are not worth a log line
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
    return server


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)
