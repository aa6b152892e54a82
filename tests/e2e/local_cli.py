"""Run `rlboost local` as a real subprocess for end-to-end tests: a deadline, and what every process was doing.

A run past its deadline is a hang, and a hang seen once in CI must be explainable from CI's output alone: before
stopping the run, every descendant service is asked for its stacks (SIGUSR1: threads, SIGUSR2: asyncio tasks;
see rlboost/observability.py), and the failure shows the tail of every child's log in the run directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DUMP_WAIT_S = 2.0  # for the stack dumps to reach the logs
STOP_WAIT_S = 30.0  # for `rlboost local` to stop its children after SIGINT
LOG_TAIL_LINES = 40
LINE_CHARS = 400  # JSON log lines can be long; the start says what happened


def run_local(*args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m rlboost.cli.main local ARGS`; fails the test on a timeout or a non-zero exit."""
    return finish_local(start_local(*args), *args, timeout=timeout)


def start_local(*args: str | Path) -> subprocess.Popen:
    """`python -m rlboost.cli.main local ARGS` started in the background (finish it with `finish_local`)."""
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", *map(str, args)]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_local(proc: subprocess.Popen, *args: str | Path, timeout: float = 900) -> subprocess.CompletedProcess:
    """Wait for a started run; fails the test on a timeout (after the stack dumps) or a non-zero exit."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _stop_hung(proc)
        shown = " ".join(map(str, args))
        pytest.fail(
            f"rlboost local {shown} did not finish in {timeout:.0f} s:\n{out[-4000:]}\n{err[-4000:]}\n"
            f"{_log_tails(args)}"
        )
    res = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert res.returncode == 0, f"exit {res.returncode}\n{out[-4000:]}\n{err[-4000:]}\n{_log_tails(args)}"
    return res


def _stop_hung(proc: subprocess.Popen) -> tuple[str, str]:
    """Stack dumps from the run and every descendant, then SIGINT (the run stops its children), then SIGKILL if need be."""
    for pid in [proc.pid, *_descendants(proc.pid)]:
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    time.sleep(DUMP_WAIT_S)  # not synchronisation: the dumps are written by processes that may be hung
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def service_pids(root: int) -> dict[str, int]:
    """The run's services by child name (nats, weight-server, rollout-manager, trainer, each worker's id) -> pid,
    from the command lines of the processes under `root` (a reward sandbox or compiler process is none of them)."""
    found: dict[str, int] = {}
    for pid in _descendants(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        name = _service_name(argv)
        if name:
            found[name] = pid
    return found


_MODULES = {"weight_server": "weight-server", "rollout_manager": "rollout-manager", "trainer": "trainer"}


def _service_name(argv: list[str]) -> str:
    if argv and argv[0].endswith("nats-server"):
        return "nats"
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    if module == "rollout_worker" and "--worker-id" in argv[:-1]:
        return argv[argv.index("--worker-id") + 1]
    return _MODULES.get(module, "")


def _descendants(root: int) -> list[int]:
    """Pids of every process under `root` (children run in their own sessions, so walk parents, not groups)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        kids = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += kids
        frontier = kids
    return found


def _log_tails(args: tuple[str | Path, ...]) -> str:
    """The last lines of every child's log under the run's --run-dir (nothing when the run had none)."""
    names = list(map(str, args))
    if "--run-dir" not in names:
        return ""
    logs = sorted((Path(names[names.index("--run-dir") + 1]) / "logs").glob("*.log"))
    blocks = []
    for log in logs:
        lines = [line[:LINE_CHARS] for line in log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]]
        blocks.append(f"----- {log.name} (last {len(lines)} lines)\n" + "\n".join(lines))
    return "\n".join(blocks)
