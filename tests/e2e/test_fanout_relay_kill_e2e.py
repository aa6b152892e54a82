"""End to end: a relay killed mid-fan-out delays, never blocks, the others.

A real weight-server process and four weights-client processes (bench/fanout_node.py: a worker's weight path,
peer server included, without the engine), all on 127.0.0.1. The first node is made its region's relay and pulls
through a throttling TCP proxy, so that its pull lasts seconds; the other three chain behind it. As soon as the relay
has served its first chunk to a peer (its own report on stdout, not a clock) it gets SIGKILL; every other node must
still reach the trainer's exact bytes (sha256) and the chain behind the first one must still have served peers.
Run it alone with `.venv/bin/pytest -m slow tests/e2e/test_fanout_relay_kill_e2e.py`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from rlboost.nats_server import free_port, wait_for_port
from rlboost.weights.client import WeightClient
from tests.weight_server.servers import ROOT, TOKEN, spawn

pytestmark = pytest.mark.slow
CHUNK = 64 << 10
PAYLOAD = CHUNK * 64  # 4 MiB: ~4 s through the proxy's ~1 MB/s


class Node:
    """A bench/fanout_node.py process; its JSON events read by a thread into a queue."""

    def __init__(self, name: str, server: str) -> None:
        args = [
            sys.executable,
            str(ROOT / "bench/fanout_node.py"),
            "--server",
            server,
            "--worker",
            name,
            "--zone",
            "z",
            "--region",
            "r",
            "--token",
            TOKEN,
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        self.events: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def wait(self, event: str, timeout: float = 60) -> dict:
        """The next event named `event` (earlier ones are kept in `seen`); fails after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            self.seen.append(got)
            if got["event"] == event:
                return got

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def sha256(self) -> str:
        """The sha256 of the whole payload the node pulled (asked for after its `done`)."""
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return self.wait("stats")["sha256"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream and not stream.closed:
                stream.close()


class ThrottlingProxy:
    """Forwards loopback TCP to the weight-server, the responses at about `rate` bytes per second (a slow link)."""

    def __init__(self, upstream_port: int, rate: int) -> None:
        self.upstream_port, self.rate, self.port = upstream_port, rate, free_port()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> ThrottlingProxy:
        self._thread.start()
        wait_for_port("127.0.0.1", self.port, 10)
        return self

    async def _main(self) -> None:
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        async with server:
            await server.serve_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, slow: bool) -> None:
            try:
                while data := await src.read(16 << 10):
                    dst.write(data)
                    await dst.drain()
                    if slow:
                        await asyncio.sleep(len(data) / self.rate)  # the link's pace, not synchronisation
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))


async def _upload(url: str) -> bytes:
    payload = os.urandom(PAYLOAD)
    async with WeightClient(url, token=TOKEN) as wc:
        await wc.upload(0, payload, checksum="c")
    return payload


def test_a_relay_killed_mid_transfer_delays_never_blocks_the_others(tmp_path) -> None:
    port = free_port()
    (tmp_path / "token").write_text(TOKEN + "\n")
    server = spawn(
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path / "data"),
        "--token-file",
        str(tmp_path / "token"),
        "--no-nats",
        "--chunk-bytes",
        str(CHUNK),
    )
    nodes: list[Node] = []
    try:
        wait_for_port("127.0.0.1", port, 30)
        url = f"http://127.0.0.1:{port}"
        want = hashlib.sha256(asyncio.run(_upload(url))).hexdigest()
        proxy = ThrottlingProxy(port, rate=1 << 20).start()
        relay = Node("relay", f"http://127.0.0.1:{proxy.port}")
        others = [Node(f"n{i}", url) for i in range(3)]
        nodes += [relay, *others]
        for node in nodes:
            node.wait("ready")
        relay.go()
        assert relay.wait("sources")["relay"], "the first puller of the region is its relay"
        for node in others:
            node.go()
        relay.wait("served")
        relay.proc.send_signal(signal.SIGKILL)
        relay.proc.wait(10)
        assert not any(e["event"] == "done" for e in relay.seen), "the relay was to be killed mid-transfer"
        done = [node.wait("done", timeout=120) for node in others]
        assert [node.sha256() for node in others] == [want] * 3
        assert sum(d["peer_failures"] for d in done) >= 1  # someone lost the relay mid-pull and went elsewhere
        assert sum(d["peer_bytes"] for d in done) > 0  # the chain behind it still served
    finally:
        for node in nodes:
            node.stop()
        server.terminate()
        server.communicate(timeout=15)
