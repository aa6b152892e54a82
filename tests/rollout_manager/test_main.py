"""`python -m rollout_manager` as a real subprocess: serves gRPC, /healthz and /metrics; clear errors."""

from __future__ import annotations

import subprocess
import sys

import grpc
import httpx
import pytest

from rlboost.auth.credentials import COLOCATION_KEY, TICKET_KEY, generate
from rlboost.nats_server import free_port, wait_for_port
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc


def _start(port: int, metrics_port: int, nats_url: str = "", *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "rollout_manager",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--nats-url",
        nats_url,
        "--namespace",
        "ns",
        "--job",
        "j",
        "--host",
        "127.0.0.1",
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_serves_grpc_health_and_metrics_then_port_clash_is_one_line(nats_server):
    port, metrics_port = free_port(), free_port()
    proc = _start(port, metrics_port, nats_server.url)
    try:
        wait_for_port("127.0.0.1", port, 20, proc)
        assert httpx.get(f"http://127.0.0.1:{metrics_port}/healthz").status_code == 200
        body = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "rlboost_manager_assignments_total" in body
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            reply = pb_grpc.RolloutManagerStub(ch).GetStatus(pb.StatusRequest(), timeout=5)
        assert reply.pending == 0 and list(reply.workers) == []

        clash = _start(port, free_port())
        _, err = clash.communicate(timeout=20)
        assert clash.returncode == 1
        lines = [line for line in err.splitlines() if line.startswith("rollout-manager:")]
        assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "Traceback" not in err
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_unreachable_nats_exits_with_one_line():
    proc = _start(free_port(), free_port(), f"nats://127.0.0.1:{free_port()}", "--nats-wait", "0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "cannot reach NATS" in err and "Traceback" not in err


def test_offload_window_comes_from_the_spec_unless_the_flag_or_env_overrides(tmp_path, monkeypatch):
    from rlboost.options.base import parse_service_args
    from rlboost.options.manager import ManagerOptions
    from rollout_manager.__main__ import offload_window_s

    config = tmp_path / "job.yaml"
    config.write_text("rollout:\n  offloadWindowS: 2.5\n")
    monkeypatch.delenv("RLBOOST_OFFLOAD_WINDOW", raising=False)
    assert offload_window_s(parse_service_args(ManagerOptions, ["--config", str(config)])) == 2.5
    assert offload_window_s(parse_service_args(ManagerOptions, ["--config", str(config), "--offload-window", "0"])) == 0
    monkeypatch.setenv("RLBOOST_OFFLOAD_WINDOW", "7")
    assert offload_window_s(parse_service_args(ManagerOptions, ["--config", str(config)])) == 7.0


@pytest.mark.parametrize("item", [TICKET_KEY, COLOCATION_KEY])
def test_credentials_without_a_key_are_one_line_naming_it(tmp_path, item):
    creds = generate(tmp_path / "credentials")
    (creds.directory / item).unlink()  # made by hand before the key existed, and never upgraded
    proc = _start(free_port(), 0, "", "--credentials-dir", str(creds.directory))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and item in err and "Traceback" not in err, err
