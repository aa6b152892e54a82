"""Test helpers: a real weight-server on a free loopback port, in a thread or as a subprocess,
and a TCP proxy that cuts its first connection after N bytes (a real socket fault)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import uvicorn

from rlboost.nats_server import free_port, wait_for_port
from rlboost.observability import LoopWatchdog
from rlboost.weights.peers import PeerDirectory
from weight_server.__main__ import bind
from weight_server.announce import Announcer
from weight_server.app import create_app
from weight_server.store import VersionStore

TOKEN = "test-token"
ROOT = Path(__file__).resolve().parents[2]


class ThreadServer:
    """uvicorn serving the real app over loopback from a background thread (its own event loop)."""

    def __init__(
        self,
        data_dir: Path,
        chunk_bytes: int = 64 << 10,
        retain: int = 20,
        read_token: str | None = None,
        nats_url: str | None = None,
        job: str = "test",
        watchdog: LoopWatchdog | None = None,
        peers: PeerDirectory | None = None,
    ) -> None:
        self.store = VersionStore(data_dir, chunk_bytes, retain)
        self.watchdog = watchdog
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.announcer = Announcer(nats_url, "default", job) if nats_url else None
        self.app = create_app(self.store, TOKEN, read_token, self.announcer, watchdog=watchdog, peers=peers)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_config=None, access_log=False, lifespan="off"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.error: BaseException | None = None

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        if self.watchdog is not None:
            self.watchdog.start()
        try:
            if self.announcer:
                await self.announcer.connect()
            await self.server.serve(sockets=[bind("127.0.0.1", self.port)])
        except BaseException as err:  # surfaced by start()
            self.error = err
        finally:
            if self.announcer:
                await self.announcer.close()

    def start(self) -> ThreadServer:
        self._thread.start()
        wait_for_port("127.0.0.1", self.port, 15)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)

    def __enter__(self) -> ThreadServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m weight_server ARGS` as a child process (stderr captured)."""
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'services/weight-server'}", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "weight_server", *args],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class CuttingProxy:
    """Forwards loopback TCP to a server; the first connection to carry `cut_after` response bytes is aborted there
    (one cut in all: the payload streams and the JSON calls use separate connections, in any order)."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port, self.cut_after = upstream_port, cut_after
        self.connections = 0
        self.cuts = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        ureader, uwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        up = asyncio.create_task(self._pipe(creader, uwriter, None))
        if await self._pipe(ureader, cwriter, self.cut_after):
            cwriter.transport.abort()  # RST to the client mid-response
            uwriter.transport.abort()
        up.cancel()
        for w in (cwriter, uwriter):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int | None) -> bool:
        """Forward until EOF; True when it stopped at `limit` to cut the connection (the first to get there)."""
        sent = 0
        try:
            while data := await reader.read(16384):
                if limit is not None and not self.cuts and sent + len(data) >= limit:
                    self.cuts += 1  # checked and counted with no await between: one cut in all
                    writer.write(data[: limit - sent])
                    await writer.drain()
                    return True
                writer.write(data)
                await writer.drain()
                sent += len(data)
        except (ConnectionError, asyncio.CancelledError):
            return False
        writer.close()
        return False
