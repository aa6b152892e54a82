"""Half-sent requests against a real `python -m weight_server` process (issue 31 item 6): the audit held 600
half-sent HTTP requests open. Real sockets here: clients that trickle a request header byte by byte, and an upload
that stops mid-body. With --header-timeout 1 --body-timeout 1 each is closed by the server (the header ones
however they trickle, the body one answered 408), nothing of the upload is kept, and the server goes on serving.
"""

from __future__ import annotations

import contextlib
import socket

import httpx

from rlboost.nats_server import free_port, wait_for_port
from tests.helpers import wait_until
from tests.weight_server.servers import TOKEN, spawn

CLIENTS = 60
TRICKLE = b"GET /v1/versions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200  # never ends with a blank line


def _closed(sock: socket.socket) -> bool:
    """The server closed it (EOF or reset); False while it is still open. The socket is non-blocking."""
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_trickled_headers_and_stalled_bodies_are_closed_and_the_server_goes_on(tmp_path) -> None:
    port, token = free_port(), tmp_path / "token"
    token.write_text(TOKEN)
    args = ["--port", str(port), "--data-dir", str(tmp_path / "data"), "--token-file", str(token)]
    proc = spawn(*args, "--no-nats", "--host", "127.0.0.1", "--header-timeout", "1", "--body-timeout", "1")
    socks: list[socket.socket] = []
    try:
        wait_for_port("127.0.0.1", port, 30, proc)
        for _ in range(CLIENTS):
            s = socket.create_connection(("127.0.0.1", port))
            s.setblocking(False)
            socks.append(s)
        sent = 0

        def all_closed() -> bool:
            nonlocal sent
            if sent < len(TRICKLE):  # a byte to every client each poll: each one's keep-alive would restart
                for s in socks:
                    with contextlib.suppress(OSError):  # closed by the server already
                        s.send(TRICKLE[sent : sent + 1])
                sent += 1
            return all(_closed(s) for s in socks)

        wait_until(all_closed, timeout=60, interval=0.05, what="every trickling client closed by the server")

        with socket.create_connection(("127.0.0.1", port)) as stalled:
            stalled.sendall(
                b"PUT /v1/versions/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
                b"X-Rlboost-Checksum: c\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000
            )
            stalled.settimeout(60)
            answer = b""
            while chunk := stalled.recv(4096):  # the server answers, then closes
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"--body-timeout" in answer, answer[:300]

        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
            assert c.get("/v1/versions", headers={"Authorization": f"Bearer {TOKEN}"}).json()["versions"] == []
            metrics = c.get("/metrics").text
        assert f'rlboost_weights_slow_requests_closed_total{{phase="header"}} {float(CLIENTS)}' in metrics
        assert 'rlboost_weights_slow_requests_closed_total{phase="body"} 1.0' in metrics
        assert list((tmp_path / "data" / "incoming").iterdir()) == []  # nothing of the upload kept
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.communicate(timeout=15)
