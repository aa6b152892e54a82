"""rlboost.observability over real sockets and a real asyncio loop: the metrics server closes idle connections,
and LoopWatchdog's health fails while (and shortly after) its loop is blocked."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from rlboost.nats_server import free_port
from rlboost.observability import JsonFormatter, LoopWatchdog, serve_http
from tests.helpers import wait_until


def test_idle_connections_to_the_metrics_server_are_closed():
    port = free_port()
    server = serve_http(port, host="127.0.0.1", idle_timeout_s=0.3)
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]  # never send a byte
        for sock in idle:
            assert sock.recv(1) == b""  # the server hung up (recv would time out after 5 s otherwise)
            sock.close()
        assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()


def test_health_fails_while_the_loop_is_blocked_and_recovers():
    watchdog = LoopWatchdog(max_lag_s=0.5, interval_s=0.05)
    port = free_port()
    server = serve_http(port, health=watchdog.healthy, host="127.0.0.1")
    blocked, release = threading.Event(), threading.Event()

    def block() -> None:  # the fault: a handler that holds the loop
        blocked.set()
        release.wait(10)

    async def main() -> list[int]:
        watchdog.start()
        url = f"http://127.0.0.1:{port}/healthz"
        before = (await asyncio.to_thread(httpx.get, url, timeout=5)).status_code

        def probe() -> int:
            blocked.wait(10)
            code = wait_until(lambda: httpx.get(url, timeout=5).status_code == 503, 5, what="503 while blocked")
            release.set()
            return code

        prober = asyncio.get_running_loop().run_in_executor(None, probe)
        asyncio.get_running_loop().call_soon(block)
        await prober
        await asyncio.to_thread(wait_until, lambda: httpx.get(url, timeout=5).status_code == 200, 5)
        await watchdog.stop()
        return [before]

    try:
        assert asyncio.run(main()) == [200]
        assert not watchdog.healthy()  # stopped: nothing turns any more
    finally:
        server.shutdown()
        server.server_close()


def test_a_block_is_still_reported_just_after_the_loop_turns_again():
    """A health check served by the blocked loop itself answers only afterwards: it must still say so."""
    watchdog = LoopWatchdog(max_lag_s=0.2, interval_s=0.05)

    async def main() -> tuple[bool, float]:
        watchdog.start()
        await asyncio.sleep(0)  # its task stamps once
        stamp = watchdog._stamp
        time.sleep(0.5)  # the fault: block the loop
        await asyncio.wait_for(_until(lambda: watchdog._stamp != stamp), 5)  # the loop turned: a fresh stamp
        return watchdog.healthy(), watchdog.lag_s()

    healthy, lag = asyncio.run(main())
    assert not healthy and lag >= 0.4


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


HUNG_SERVICE = """
import asyncio
from rlboost.observability import setup_logging
setup_logging("hung")

async def wait_for_a_reply_that_never_comes():
    await asyncio.Event().wait()

async def main():
    task = asyncio.create_task(wait_for_a_reply_that_never_comes(), name="stuck-step")
    await asyncio.sleep(0)  # the task runs up to its await
    print("ready", flush=True)
    await task

asyncio.run(main())
"""


def test_a_hung_service_tells_where_it_waits_on_sigusr1_and_sigusr2() -> None:
    """A real process with a task stuck on an await: SIGUSR2 writes each task's await chain, SIGUSR1 every
    thread's stack, to its stderr (its log), and neither signal stops it."""
    cmd = [sys.executable, "-c", HUNG_SERVICE]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR2)
        proc.send_signal(signal.SIGUSR1)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # still running: a dump is no stop
        proc.kill()
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert "task stuck-step: <string>:7 in wait_for_a_reply_that_never_comes -> locks.py" in err, err
    assert "most recent call first" in err, err  # faulthandler's thread dump


def test_a_service_crashing_in_native_code_says_where_in_its_log() -> None:
    """A real process that reads address 0 in C (as the strlen(NULL) crashes this machine's kernel log shows,
    from a python process nobody could name): its stderr names the Python line that called it."""
    code = (
        "from rlboost.observability import dump_stacks_on_signals\n"
        "import ctypes\n"
        "dump_stacks_on_signals()\n"
        "def read_a_null_pointer():\n"
        "    ctypes.string_at(0)\n"
        "read_a_null_pointer()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGSEGV, proc
    assert "Segmentation fault" in proc.stderr and "in read_a_null_pointer" in proc.stderr, proc.stderr


def test_kopf_lines_keep_their_object_but_not_kopfs_settings() -> None:
    """kopf logs every line with `settings` (its whole OperatorSettings) beside `k8s_ref`: printed, each operator
    line was ~2 KB, and a failing test's log tail showed two lines."""
    formatter = JsonFormatter("operator")
    ref = {"kind": "RLJob", "name": "job1"}
    kopf = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Handler succeeded.", (), None)
    kopf.__dict__.update(settings=object(), k8s_ref=ref)
    ours = logging.LogRecord("rlboost_operator.handlers", logging.INFO, __file__, 1, "scaled", (), None)
    ours.__dict__.update(settings="a field of our own")
    line = json.loads(formatter.format(kopf))
    assert "settings" not in line and line["k8s_ref"] == ref
    assert json.loads(formatter.format(ours))["settings"] == "a field of our own"
