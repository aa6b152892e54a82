"""Child processes of `rlboost local`: each in its own process group, logged to a file, stopped without orphans.

    sup = Supervisor(run_dir / "logs")
    sup.start("weight-server", argv)           # stdout+stderr -> logs/weight-server.log
    sup.wait_ready("weight-server", port, health_url, timeout=60)   # raises ChildFailedError if it dies
    for child in sup.unexpected_exits(): ...   # children that died without being asked to
    sup.shutdown(grace_s=10)                   # SIGTERM every group, wait, SIGKILL leftovers

A process group per child (start_new_session) lets shutdown reach grandchildren too (e.g. torchrun ranks).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
RENDEZVOUS_VARS = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"})


class ChildFailedError(RuntimeError):
    """A child died (or never became ready); the message is one block: name, exit code, last log lines."""

    def __init__(self, name: str, code: int | None, reason: str, tail: str) -> None:
        self.name, self.code, self.reason, self.tail = name, code, reason, tail
        head = f"{name} {reason}" + (f" (exit code {code})" if code is not None else "")
        body = "\n".join("    " + line for line in tail.splitlines()) if tail else "    (no output)"
        super().__init__(f"{head}; last lines of its log:\n{body}")


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    role: str = ""
    pool: str = ""
    started_at: float = field(default_factory=time.monotonic)
    expected_exit: bool = False  # we killed it (trace, chaos, shutdown): its exit is no failure
    reported: bool = False
    ready_port: int | None = None  # the port its readiness was checked on, to name in a failure

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def tail_lines(path: Path, n: int = 15, max_bytes: int = 64 * 1024) -> str:
    """The last `n` lines of a log file (reads at most `max_bytes` from its end)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-n:])


def _die_with_parent() -> None:
    """In the child before exec: get SIGKILL when the CLI dies, even by SIGKILL (Linux), so nothing is orphaned.

    Children are only started from the CLI's main thread, which lives as long as the CLI.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _child_setup(cores: tuple[int, ...]) -> Callable[[], None]:
    """What the child runs before exec: `_die_with_parent`, then its CPUs when it has its own (before exec, so every
    thread it ever starts inherits them)."""

    def setup() -> None:
        _die_with_parent()
        if cores:
            os.sched_setaffinity(0, cores)

    return setup


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the whole group is gone already
        os.killpg(pid, sig)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.25):
            return True
    except OSError:
        return False


NOT_HTTP = "not HTTP"


def _health_answer(url: str) -> str:
    """What a GET of `url` got: "ok" (a 200), NOT_HTTP (bytes that are not HTTP: another program holds the port), or
    why it is not ready yet. A connection closed without an answer (RemoteDisconnected) is a server still starting."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:  # noqa: S310 (loopback URL we built)
            return "ok" if resp.status == 200 else f"status {resp.status}"
    except http.client.RemoteDisconnected:
        return "closed without an answer"
    except http.client.HTTPException:  # BadStatusLine & co
        return NOT_HTTP
    except (urllib.error.URLError, OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def _healthy(url: str) -> bool:
    """True on a 200; any other answer, or none, is not healthy (never raises)."""
    return _health_answer(url) == "ok"


# What a server's log says when its port is taken: errno 98 (Python, uvicorn, torch), Go's message (nats-server),
# gRPC's bind failure.
_PORT_TAKEN = re.compile(r"address already in use|EADDRINUSE|failed to bind to address", re.IGNORECASE)
_PORT_IN_LINE = re.compile(r"[:, ](\d{4,5})\b")  # ('127.0.0.1', 39163) or 127.0.0.1:4222


def port_taken_reason(port: int | None) -> str:
    where = f"port {port}" if port else "a port it listens on"
    return f"could not start: {where} is in use by another program"


def exit_reason(tail: str, default: str, port: int | None = None) -> str:
    """`default`, unless the log says the child could not bind its port: then which port, from the log if it
    names one, else `port`."""
    lines = [line for line in tail.splitlines() if _PORT_TAKEN.search(line)]
    if not lines:
        return default
    named = [int(p) for p in _PORT_IN_LINE.findall(lines[-1]) if int(p) <= 65535]
    return port_taken_reason(named[-1] if named else port)


class Supervisor:
    """Starts, watches and stops the children of one local run."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, Child] = {}

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        role: str = "",
        pool: str = "",
        cores: tuple[int, ...] = (),
    ) -> Child:
        """Start `argv` in a new session (its own process group), output appended to logs/<name>.log, on `cores`
        (empty: this process's CPUs)."""
        if name in self.children and self.children[name].alive:
            raise ValueError(f"child {name!r} is already running")
        # The plan's env is a default the user's environment overrides (e.g. OMP_NUM_THREADS), except a trainer's rendezvous: one inherited
        # (a parent that ran a process group, a shell inside torchrun) would point the trainer at a port in use.
        plan_wins = {k: v for k, v in (env or {}).items() if k in RENDEZVOUS_VARS}
        full_env = {**(env or {}), **os.environ, **plan_wins, "PYTHONUNBUFFERED": "1"}
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as out:  # the child keeps its own descriptor
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
                preexec_fn=_child_setup(cores),
            )
        child = Child(name, proc, log_path, role=role, pool=pool)
        self.children[name] = child
        log.info("started child", extra={"child": name, "pid": proc.pid, "cores": list(cores)})
        return child

    def wait_ready(self, name: str, port: int | None, health_url: str = "", timeout: float = 60.0) -> None:
        """Block until the child listens on `port` (and `health_url` answers 200), or raise ChildFailedError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.check_ready(name, port, health_url):
                return
            time.sleep(0.1)  # polling a process we do not control; there is nothing to await
        what = health_url or f"port {port}"
        raise ChildFailedError(name, None, f"was not ready after {timeout:.0f}s (waiting for {what})", self.tail(name))

    def check_ready(self, name: str, port: int | None, health_url: str = "") -> bool:
        """One readiness probe (at most ~1 s); raises ChildFailedError if the child has died."""
        child = self.children[name]
        child.ready_port = port
        if not child.alive:
            child.reported = True
            tail = self.tail(name)
            raise ChildFailedError(name, child.proc.returncode, exit_reason(tail, "exited during start-up", port), tail)
        if port is not None and not _port_open(port):
            return False
        if not health_url:
            return True
        answer = _health_answer(health_url)
        if answer == NOT_HTTP:  # the child would fail to bind the port, or has: either way, not the child answered
            reason = f"{port_taken_reason(urllib.parse.urlsplit(health_url).port)} (its {health_url} answered {answer})"
            raise ChildFailedError(name, None, reason, self.tail(name))
        return answer == "ok"

    def probe_ready(self, name: str, port: int | None, health_url: str = "") -> bool:
        """One readiness probe that never raises: False while the child is dead (its death is left to
        `unexpected_exits`) or another program answers its port."""
        if not self.children[name].alive or (port is not None and not _port_open(port)):
            return False
        return not health_url or _health_answer(health_url) == "ok"

    def tail(self, name: str, n: int = 15) -> str:
        return tail_lines(self.children[name].log_path, n)

    def unexpected_exits(self, among: set[str] | None = None) -> list[Child]:
        """Children (of `among`, if given) that exited without being asked to; each is returned once."""
        out = []
        for child in self.children.values():
            if among is not None and child.name not in among:
                continue
            if not child.reported and not child.expected_exit and not child.alive:
                child.reported = True
                out.append(child)
        return out

    def failure(self, child: Child, reason: str = "exited unexpectedly") -> ChildFailedError:
        tail = self.tail(child.name)
        return ChildFailedError(child.name, child.proc.returncode, exit_reason(tail, reason, child.ready_port), tail)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a child's whole process group and mark its exit as expected (e.g. a spot preemption)."""
        child = self.children[name]
        child.expected_exit = True
        _signal_group(child.pid, sig)
        if sig == signal.SIGKILL:
            child.proc.wait()

    def running(self, pool: str | None = None, role: str | None = None) -> list[Child]:
        """Live children, optionally of one pool or role, in start order."""
        return [
            c
            for c in self.children.values()
            if c.alive and not c.expected_exit and (pool is None or c.pool == pool) and (role is None or c.role == role)
        ]

    def pids(self) -> list[int]:
        return [c.pid for c in self.children.values()]

    def shutdown(self, grace_s: float = 10.0) -> list[str]:
        """SIGTERM every child's group (newest first), wait up to `grace_s`, SIGKILL the rest.

        Returns the names of children that had to be SIGKILLed.
        """
        children = list(self.children.values())[::-1]
        for c in children:
            c.expected_exit = True
            if c.alive:
                _signal_group(c.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(max(0.0, deadline - time.monotonic()))
        killed = [c.name for c in children if c.alive]
        # SIGKILL every group, even those whose leader exited: grandchildren may still hold it.
        for c in children:
            _signal_group(c.pid, signal.SIGKILL)
        for c in children:
            c.proc.wait()
        if killed:
            log.warning("children killed after the grace period", extra={"children": killed})
        return killed
