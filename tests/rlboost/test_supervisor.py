"""The supervisor with real child processes (small `python -c` programs): start-up, failure propagation,
SIGKILL of children that ignore SIGTERM, process groups (grandchildren die too), no orphans."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from rlboost.local.supervisor import ChildFailedError, Supervisor, _healthy, exit_reason, tail_lines
from rlboost.nats_server import NatsServer, free_port
from tests.helpers import wait_until

PY = sys.executable

LISTEN = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
while True:
    time.sleep(1)
"""


def pid_alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def test_ready_when_listening_and_logs_go_to_file(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    port = free_port()
    try:
        child = sup.start("svc", [PY, "-c", LISTEN, str(port)], role="svc")
        sup.wait_ready("svc", port, timeout=15)
        assert child.alive
        wait_until(lambda: "listening" in tail_lines(tmp_path / "logs" / "svc.log"), what="log line")
        assert os.getpgid(child.pid) == child.pid  # its own process group
    finally:
        sup.shutdown(grace_s=5)
    assert not pid_alive(child.pid)


def test_death_during_startup_names_child_code_and_last_lines(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    code = "import sys; print('loading model'); print('cannot load the model', file=sys.stderr); sys.exit(3)"
    sup.start("rollout-worker-x", [PY, "-c", code])
    with pytest.raises(ChildFailedError) as info:
        sup.wait_ready("rollout-worker-x", free_port(), timeout=15)
    msg = str(info.value)
    assert msg.startswith("rollout-worker-x exited during start-up (exit code 3)")
    assert "cannot load the model" in msg and "loading model" in msg
    assert sup.unexpected_exits() == []  # already reported once
    sup.shutdown(grace_s=1)


def test_not_ready_before_deadline(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    sup.start("slow", [PY, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(ChildFailedError, match=r"slow was not ready after 1s \(waiting for port"):
            sup.wait_ready("slow", free_port(), timeout=1)
    finally:
        sup.shutdown(grace_s=5)


def test_unexpected_exit_is_reported_once_and_kill_is_expected(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs")
    port = free_port()
    try:
        sup.start("crashy", [PY, "-c", "import sys; sys.exit(7)"])
        victim = sup.start("spot-0", [PY, "-c", LISTEN, str(port)], pool="spot")
        sup.wait_ready("spot-0", port, timeout=15)
        sup.kill("spot-0")  # a preemption: SIGKILL, not a failure
        assert victim.proc.returncode == -signal.SIGKILL
        exits = wait_until(sup.unexpected_exits, what="crashy's exit")
        assert [c.name for c in exits] == ["crashy"]
        assert sup.failure(exits[0]).code == 7
        assert sup.unexpected_exits() == []
        assert sup.running(pool="spot") == []
    finally:
        sup.shutdown(grace_s=5)


def test_shutdown_sigkills_children_ignoring_sigterm_and_their_grandchildren(tmp_path: Path) -> None:
    stubborn = f"""
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = subprocess.Popen([{PY!r}, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1], "w").write(str(g.pid))
while True:
    time.sleep(1)
"""
    sup = Supervisor(tmp_path / "logs")
    pidfile = tmp_path / "grandchild.pid"
    polite = sup.start("polite", [PY, "-c", "import time; time.sleep(600)"])
    child = sup.start("stubborn", [PY, "-c", stubborn, str(pidfile)])
    grandchild = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), what="grandchild pid"))
    killed = sup.shutdown(grace_s=1)
    assert killed == ["stubborn"]
    assert polite.proc.returncode == -signal.SIGTERM and child.proc.returncode == -signal.SIGKILL
    wait_until(lambda: not pid_alive(grandchild), timeout=5, what="grandchild gone")
    assert not any(pid_alive(p) for p in sup.pids())


def test_a_childs_rendezvous_beats_the_inherited_one_and_other_defaults_do_not(tmp_path: Path, monkeypatch) -> None:
    """An inherited MASTER_PORT (the test process itself had run a process group on it) sent a local trainer to a
    port in use (EADDRINUSE): the plan's rendezvous wins; its other variables stay defaults the user overrides."""
    monkeypatch.setenv("MASTER_PORT", "1111")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    sup = Supervisor(tmp_path / "logs")
    show = "import os; print(os.environ['MASTER_PORT'], os.environ['OMP_NUM_THREADS'], flush=True)"
    try:
        sup.start("child", [PY, "-c", show], env={"MASTER_PORT": "2222", "OMP_NUM_THREADS": "1"})
        wait_until(lambda: sup.tail("child").strip(), timeout=30, what="the child's output")
    finally:
        sup.shutdown(grace_s=5)
    assert sup.tail("child").strip() == "2222 4"


def test_a_child_and_every_thread_it_starts_run_on_its_cpus(tmp_path: Path) -> None:
    """rlboost.local.plan.core_split's CPUs hold for the child's threads too (torch's, gRPC's): set before exec."""
    cpus = sorted(os.sched_getaffinity(0))
    sup = Supervisor(tmp_path / "logs")
    show = (
        "import os, threading; seen = []; t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)));"
        "t.start(); t.join(); print(sorted(os.sched_getaffinity(0)), sorted(seen[0]), flush=True)"
    )
    try:
        sup.start("pinned", [PY, "-c", show], cores=(cpus[-1],))
        sup.start("free", [PY, "-c", show])
        wait_until(lambda: sup.tail("pinned").strip() and sup.tail("free").strip(), timeout=30, what="the output")
    finally:
        sup.shutdown(grace_s=5)
    assert sup.tail("pinned").strip() == f"[{cpus[-1]}] [{cpus[-1]}]"
    assert sup.tail("free").strip() == f"{cpus} {cpus}"


def test_a_port_answered_by_another_program_is_not_ready_and_named(tmp_path: Path) -> None:
    """The weight-server's health URL answered by another run's nats-server (its INFO line, not HTTP): not healthy,
    no traceback, and the child's start-up fails naming the port."""
    with NatsServer(tmp_path / "nats") as nats:
        url = f"http://127.0.0.1:{nats.port}/healthz"
        assert _healthy(url) is False
        sup = Supervisor(tmp_path / "logs")
        sup.start("weight-server", [PY, "-c", "import time; time.sleep(60)"])
        try:
            with pytest.raises(ChildFailedError) as info:
                sup.wait_ready("weight-server", nats.port, url, timeout=15)
        finally:
            sup.shutdown(grace_s=5)
    assert str(info.value).startswith(f"weight-server could not start: port {nats.port} is in use by another program")


def test_a_child_that_cannot_bind_its_port_says_which_port(tmp_path: Path) -> None:
    """A port-only readiness check passes on the other program's listener; the child's exit then names the port."""
    bind = "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1])))"
    sup = Supervisor(tmp_path / "logs")
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        port = held.getsockname()[1]
        try:
            sup.start("rollout-manager", [PY, "-c", bind, str(port)])
            sup.wait_ready("rollout-manager", port, timeout=15)
            exits = wait_until(sup.unexpected_exits, what="the child's exit")
        finally:
            sup.shutdown(grace_s=1)
    msg = str(sup.failure(exits[0]))
    assert msg.startswith(f"rollout-manager could not start: port {port} is in use by another program (exit code 1)")
    assert "Address already in use" in msg  # the log's last lines still follow


def test_exit_reason_reads_the_port_from_servers_messages() -> None:
    uvicorn = (
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 39163): address already in use"
    )
    nats = '[4711] 2026/11/24 10:00:01.000000 [FTL] Error listening on port: 127.0.0.1:4222, "listen tcp 127.0.0.1:4222: bind: address already in use"'
    assert exit_reason(uvicorn, "exited", 1) == "could not start: port 39163 is in use by another program"
    assert exit_reason(nats, "exited") == "could not start: port 4222 is in use by another program"
    assert exit_reason("OSError: [Errno 98] Address already in use", "exited", 5000).endswith(
        "port 5000 is in use by another program"
    )
    assert exit_reason("RuntimeError: Failed to bind to address 127.0.0.1:0", "exited") == (
        "could not start: a port it listens on is in use by another program"
    )
    assert exit_reason("Traceback ...\nValueError: no model", "exited unexpectedly") == "exited unexpectedly"


def test_backoff_doubles_per_quick_death_is_capped_gives_up_and_resets_after_a_stable_run() -> None:
    from rlboost.local.restarts import BACKOFF_CAP_S, CRASH_LOOP_LIMIT, STABLE_AFTER_S, BackOff

    b = BackOff()
    delays = [b.delay("svc", uptime_s=1.0) for _ in range(CRASH_LOOP_LIMIT - 1)]
    assert delays == [0.5, 1.0, 2.0, 4.0, BACKOFF_CAP_S][: CRASH_LOOP_LIMIT - 1]
    assert b.delay("svc", uptime_s=1.0) is None  # a crash loop: the run fails with its log
    assert b.delay("svc", uptime_s=STABLE_AFTER_S) == 0.0  # a long run first: a kill, restarted at once
    assert b.delay("svc", uptime_s=1.0) == 1.0 and b.delay("other", uptime_s=1.0) == 0.5


def test_a_child_sigkilled_from_outside_is_restarted_on_its_port_and_recorded(tmp_path: Path) -> None:
    """As the OOM killer would: SIGKILL from outside the supervisor; the child comes back listening on its port, and
    the record says how it ended, its back-off and when it was back."""
    from rlboost.local.restarts import Restarts

    sup, port = Supervisor(tmp_path / "logs"), free_port()
    argv = [PY, "-c", LISTEN, str(port)]
    shown = []
    restarts = Restarts(
        sup,
        started_at=time.monotonic(),
        start_child=lambda name: sup.start(name, argv, role="weight-server"),
        ready=lambda name: sup.probe_ready(name, port),
        on_restart=shown.append,
    )
    try:
        first = sup.start("weight-server", argv, role="weight-server")
        sup.wait_ready("weight-server", port, timeout=15)
        os.kill(first.pid, signal.SIGKILL)
        (dead,) = wait_until(sup.unexpected_exits, timeout=15, what="the death seen")
        restarts.died(dead, time.monotonic())
        assert restarts.due(time.monotonic()) == [] and not restarts.back("weight-server")  # its back-off first

        def tick() -> bool:
            now = time.monotonic()
            for name in restarts.due(now):
                restarts.start(name, now)
            restarts.poll(now)
            return restarts.back("weight-server")

        wait_until(tick, timeout=15, what="the restart back")
        assert sup.children["weight-server"].pid != first.pid and sup.probe_ready("weight-server", port)
        (record,) = restarts.records
        assert (record.process, record.cause, record.ended, record.backoff_seconds) == (
            "weight-server",
            "died",
            "SIGKILL",
            0.5,
        )
        assert record.back_after_seconds is not None and record.back_after_seconds >= 0.5 and shown == [record]
    finally:
        sup.shutdown(grace_s=5)


def test_a_child_that_keeps_dying_fails_the_run_with_its_log(tmp_path: Path) -> None:
    from rlboost.local.restarts import CRASH_LOOP_LIMIT, Restarts

    sup = Supervisor(tmp_path / "logs")
    argv = [PY, "-c", "import sys; print('bad flag --x', file=sys.stderr); sys.exit(2)"]
    restarts = Restarts(sup, time.monotonic(), lambda name: sup.start(name, argv), lambda name: False)
    sup.start("nats", argv)
    with pytest.raises(ChildFailedError, match=rf"nats keeps dying \({CRASH_LOOP_LIMIT} times in a row") as info:
        for _ in range(CRASH_LOOP_LIMIT):
            (dead,) = wait_until(sup.unexpected_exits, timeout=15, what="the death seen")
            restarts.died(dead, time.monotonic())
            restarts.start("nats", time.monotonic())
    assert "bad flag --x" in str(info.value) and len(restarts.records) == CRASH_LOOP_LIMIT - 1
    sup.shutdown(grace_s=1)
