"""`rlboost local`'s services, found through `<run dir>/endpoints.json` while the job runs, give a client that
holds no credentials nothing: the manager's status and worker stream, the weight-server's versions and assets.
The observer token from the run's credentials directory reads the same status. (NATS is covered where its
accounts are made.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from tests.e2e.test_local_e2e import CONFIG  # the small two-step job (1 reserved, 2 spot workers)
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
WORKERS = 3
STEPS = "40"  # seconds long: every worker registers and the probes land while the job runs (2 steps were over
# before a spot worker registered)


def status(manager: str, auth: ClientAuth) -> pb.StatusReply:
    with auth.channel(manager) as ch:
        return pb_grpc.RolloutManagerStub(ch).GetStatus(pb.StatusRequest(), timeout=5, metadata=auth.metadata())


def workers_registered(manager: str, observer: ClientAuth) -> bool:
    try:
        return len(status(manager, observer).workers) == WORKERS
    except grpc.RpcError:
        return False


def connect_without_proof(manager: str, auth: ClientAuth, worker_id: str = "reserved-0") -> grpc.RpcError:
    """A Connect claiming a reserved id with no identity proof (and `auth`'s token, if any)."""
    register = pb.WorkerMessage(register=pb.Register(worker_id=worker_id, capacity=1, pool=pb.POOL_RESERVED))
    with auth.channel(manager) as ch, pytest.raises(grpc.RpcError) as err:
        list(pb_grpc.RolloutManagerStub(ch).Connect(iter([register]), timeout=5, metadata=auth.metadata()))
    return err.value


@pytest.mark.slow
def test_a_running_local_jobs_services_refuse_anonymous_clients(tmp_path: Path) -> None:
    cfg, run_dir = tmp_path / "job.yaml", tmp_path / "run"
    cfg.write_text(CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "rlboost.cli.main",
        "local",
        "--config",
        str(cfg),
        "--steps",
        STEPS,
        "--run-dir",
        str(run_dir),
    ]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        endpoints_file = run_dir / "endpoints.json"
        wait_until(endpoints_file.is_file, 60, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        manager, weights = endpoints["manager"], endpoints["weight_server"]
        assert endpoints["nats"].startswith("nats://") and endpoints["metrics_ports"]["rollout-manager"] > 0
        observer = ClientAuth.for_role(endpoints["credentials"], "observer")
        wait_until(lambda: workers_registered(manager, observer), 300, interval=0.5, what="every worker registered")

        with pytest.raises(grpc.RpcError) as anonymous_status:
            status(manager, ClientAuth())
        assert anonymous_status.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert connect_without_proof(manager, ClientAuth()).code() == grpc.StatusCode.UNAUTHENTICATED
        # the worker token alone: no id of its choosing (issue 14 item 1), neither a fresh one nor a live one
        worker = ClientAuth.for_role(endpoints["credentials"], "worker")
        for wid in ("reserved-9", "reserved-0"):
            refused = connect_without_proof(manager, worker, wid)
            assert refused.code() == grpc.StatusCode.UNAUTHENTICATED and "identity_proof" in refused.details()
        for path in ("/v1/versions", "/v1/versions/0/manifest", "/v1/assets", "/v1/sync?to=1"):
            assert httpx.get(weights + path, timeout=10).status_code == 401, path
        assert len(status(manager, observer).workers) == WORKERS, "the probes ended no worker's stream"

        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-4000:]
        assert not endpoints_file.exists(), "endpoints.json is removed when the run ends"
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.communicate(timeout=60)
