"""`python -m weight_server` as a real child process: serves /healthz and /metrics, survives a restart
with its versions, and reports bad configuration in one clear line with a non-zero exit."""

from __future__ import annotations

import signal
import socket

import httpx

from rlboost.nats_server import free_port, wait_for_port
from rlboost.wire.weights_io import HEADER_CHECKSUM
from tests.weight_server.servers import TOKEN, spawn
from weight_server.__main__ import bind


def flags(tmp_path, port: int, nats_url: str, data_dir=None) -> list[str]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    return [
        "--port",
        str(port),
        "--data-dir",
        str(data_dir or tmp_path / "data"),
        "--token-file",
        str(token),
        "--nats-url",
        nats_url,
        "--namespace",
        "ns",
        "--job",
        "j",
        "--host",
        "127.0.0.1",
        "--chunk-bytes",
        "4096",
    ]


def one_line_failure(args: list[str], env: dict[str, str] | None = None) -> str:
    proc = spawn(*args, env=env)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_serves_health_metrics_and_restarts_with_its_versions(tmp_path, nats_server) -> None:
    port = free_port()
    for attempt in range(2):
        proc = spawn(*flags(tmp_path, port, nats_server.url))
        try:
            wait_for_port("127.0.0.1", port, 30, proc)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
                assert c.get("/healthz").status_code == 200
                if attempt == 0:
                    r = c.put(
                        "/v1/versions/0",
                        content=b"x" * 9000,
                        headers={"Authorization": f"Bearer {TOKEN}", HEADER_CHECKSUM: "c"},
                    )
                    assert r.status_code == 200 and r.json()["chunk_bytes"] == 4096
                else:  # restarted: the version is still there
                    assert c.get("/v1/versions").json() == {"latest": 0, "versions": [0]}
                    assert c.get("/v1/versions/0/payload").content == b"x" * 9000
                served = c.get("/metrics").text
                assert "rlboost_weights_versions_held 1.0" in served
                assert 'rlboost_gc_pause_seconds_count{generation="0"}' in served  # the process's own, too
        finally:
            proc.send_signal(signal.SIGKILL if attempt == 0 else signal.SIGTERM)
            _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0  # SIGTERM: a clean shutdown
    assert '"msg": "weight-server listening"' in err and '"msg": "weight-server stopped"' in err  # JSON logs


def test_bad_data_dir_is_one_clear_line(tmp_path, nats_server) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a dir")
    line = one_line_failure(flags(tmp_path, free_port(), nats_server.url, data_dir=blocker / "sub"))
    assert line.startswith("weight-server: --data-dir") and "not a writable directory" in line


def test_port_in_use_is_one_clear_line(tmp_path, nats_server) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        line = one_line_failure(flags(tmp_path, s.getsockname()[1], nats_server.url))
    assert "cannot listen" in line and "--port" in line


def test_unreachable_nats_and_missing_token_are_one_clear_line(tmp_path) -> None:
    line = one_line_failure([*flags(tmp_path, free_port(), f"nats://127.0.0.1:{free_port()}"), "--nats-wait", "0"])
    assert line.startswith("weight-server: --nats-url: cannot reach NATS")
    args = flags(tmp_path, free_port(), "nats://127.0.0.1:1")
    i = args.index("--token-file")
    del args[i : i + 2]
    line = one_line_failure(args, env={"RLBOOST_TOKEN": ""})
    assert "no upload token" in line


def test_waits_for_a_nats_that_starts_after_it(tmp_path) -> None:
    """Started before NATS (a pod whose peer, or whose peer's DNS name, is not there yet), the weight-server keeps
    trying within --nats-wait instead of exiting, and serves once NATS is up (the cluster lane saw it restart)."""
    import threading

    from rlboost.nats_server import NatsServer
    from tests.helpers import wait_until

    port, nats_port = free_port(), free_port()
    proc = spawn(*flags(tmp_path, port, f"nats://127.0.0.1:{nats_port}"), "--nats-wait", "60")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("NATS not reachable yet" in ln for ln in lines), timeout=60, what="a failed try")
        with NatsServer(tmp_path / "nats", port=nats_port):  # only now does NATS come up
            wait_for_port("127.0.0.1", port, 60, proc)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        reader.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert any('"msg": "connected to NATS"' in ln for ln in lines)


async def test_served_connections_have_nagle_off() -> None:
    """The listening socket says TCP, so asyncio sets TCP_NODELAY on every accepted connection: with Nagle on, each
    keep-alive request after a connection's first waited ~40 ms for the client's delayed ACK (measured: 44 ms per
    /healthz on one connection, 1 ms on a new one)."""
    import asyncio

    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    class Probe(asyncio.Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            sock = transport.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    server = await asyncio.get_running_loop().create_server(Probe, sock=bind("127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        assert await asyncio.wait_for(accepted, 10) != 0
    finally:
        writer.close()
        server.close()
