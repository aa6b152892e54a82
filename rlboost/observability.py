"""Structured logs and the /metrics + /healthz endpoint every service exposes.

`setup_logging("rollout-manager")` makes every log record one JSON line on stderr;
`serve_http(port, health)` serves Prometheus metrics and a health check from a daemon thread
(for services whose main transport is not HTTP); a connection idle for `IDLE_TIMEOUT_S` is closed, so idle
clients cannot hold its threads. `LoopWatchdog` makes a health check reflect progress: it fails while the
service's asyncio loop is blocked (or has been, within the allowed lag). Every service set up by
`setup_logging` dumps its stacks to its log on request: `kill -USR1 PID` its threads' (even with its loop blocked),
`kill -USR2 PID` its asyncio tasks' (what a hung service waits on).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rlboost import gc_pauses
from rlboost.wire.service_routes import HEALTHZ, METRICS

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# kopf attaches its whole OperatorSettings to every record it logs (~2 KB once printed); the operator's lines keep
# kopf's object reference (k8s_ref) and lose that
_DROPPED = {"kopf": {"settings"}}
# Every field of a line is bounded (issue 31: a refused Register with a 600 KB worker_id wrote a 600 KB line): what a
# peer sent may be logged, but only its head, with its length.
MAX_FIELD_CHARS = 1000
MAX_EXC_CHARS = 16_000  # a traceback keeps more: its last frames say where


def bounded(value: object, limit: int = MAX_FIELD_CHARS) -> object:
    """`value` as logged: numbers and short values as they are, anything longer than `limit` once printed as its
    head and a note of its length."""
    if value is None or isinstance(value, bool | int | float):
        return value
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= limit:
        return value
    return f"{text[:limit]}... [{len(text)} chars]"


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
            "msg": bounded(record.getMessage()),
        }
        dropped = _DROPPED.get(record.name.partition(".")[0], set())
        out.update({k: bounded(v) for k, v in record.__dict__.items() if k not in _RESERVED and k not in dropped})
        if record.exc_info:
            exc = self.formatException(record.exc_info)
            out["exc"] = exc if len(exc) <= MAX_EXC_CHARS else f"[{len(exc)} chars] ...{exc[-MAX_EXC_CHARS:]}"
        return json.dumps(out, default=str)


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    dump_stacks_on_signals()
    gc_pauses.watch()  # every service's collector pauses in rlboost_gc_pause_seconds


def dump_stacks_on_signals() -> None:
    """SIGUSR1: every thread's stack to stderr (faulthandler: works while the loop is blocked); SIGUSR2: every
    asyncio task's stack (a hang in a service is a task waiting on something that never comes). A crash in native
    code (SIGSEGV, SIGBUS, SIGFPE, SIGABRT) prints every thread's Python stack too, so its log says where."""
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread (a service sets up logging there)
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, _print_tasks)


def _print_tasks(signum: int, frame: object) -> None:
    """A signal handler runs on the main thread between bytecodes, so the loop running there is reachable."""
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        print("stack dump: no asyncio loop running on the main thread", file=sys.stderr, flush=True)
        return
    print(f"stack dump: {len(tasks)} asyncio tasks", file=sys.stderr)
    for task in tasks:
        print(f"task {task.get_name()}: " + " -> ".join(_await_chain(task.get_coro())), file=sys.stderr)
    sys.stderr.flush()


def _await_chain(coro: object) -> list[str]:
    """`file:line in function` down a suspended coroutine's awaits (Task.print_stack shows only the outermost)."""
    out = []
    while coro is not None and len(out) < 40:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            out.append(type(coro).__name__)  # a Future, or a finished coroutine
            break
        out.append(f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


IDLE_TIMEOUT_S = 10.0  # a metrics/health connection that sends nothing for this long is closed


class LoopWatchdog:
    """Whether an asyncio loop keeps turning: a task on it stamps the time every `interval_s`; `healthy()`
    (callable from any thread) is False once no stamp came for `max_lag_s`, i.e. while the loop is blocked, and
    for `max_lag_s` after such a block (so a health check served by that same loop, answered only once the loop
    turns again, still reports it).

        watchdog = LoopWatchdog(max_lag_s=10)
        watchdog.start()                 # from inside the running loop
        serve_http(port, health=watchdog.healthy)
    """

    def __init__(self, max_lag_s: float = 10.0, interval_s: float | None = None) -> None:
        self.max_lag_s = max_lag_s
        self.interval_s = interval_s if interval_s is not None else min(0.5, max_lag_s / 4)
        self._stamp: float | None = None  # None: not started (healthy: nothing to watch yet)
        self._task: asyncio.Task | None = None
        self._blocked = (0.0, 0.0)  # (seconds, until when it is reported) of the last block over max_lag_s

    def start(self) -> None:
        self._stamp = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="loop-watchdog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _beat(self) -> None:
        while True:
            now = time.monotonic()
            if self._stamp is not None and (gap := now - self._stamp - self.interval_s) > self.max_lag_s:
                self._blocked = (gap, now + self.max_lag_s)
            self._stamp = now
            await asyncio.sleep(self.interval_s)

    def lag_s(self) -> float:
        """Seconds since the loop last stamped, beyond the stamping interval (0 when not started)."""
        if self._stamp is None:
            return 0.0
        if self._task is not None and self._task.done():  # the loop ended or the task died: no progress
            return float("inf")
        now = time.monotonic()
        recent = self._blocked[0] if now < self._blocked[1] else 0.0
        return max(recent, now - self._stamp - self.interval_s)

    def healthy(self) -> bool:
        return self.lag_s() <= self.max_lag_s


def serve_http(
    port: int,
    health: Callable[[], bool] = lambda: True,
    host: str = "0.0.0.0",
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> ThreadingHTTPServer:
    """Serve GET /metrics (Prometheus) and GET /healthz (200 or 503) on a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        timeout = idle_timeout_s  # a socket timeout: a client idle (or trickling) this long frees its thread

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.startswith(METRICS):
                self._reply(200, generate_latest(), CONTENT_TYPE_LATEST)
            elif self.path.startswith(HEALTHZ):
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
