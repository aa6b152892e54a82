"""The rollout-worker's options, and the pure rendering of them for one deployment."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from rlboost.options.base import HostPort, Port, ServiceOptions, Site
from rlboost.options.manager import DEFAULT_MANAGER_ADDRESS


class WorkerOptions(ServiceOptions):
    """A rollout worker: generates token streams for the rollout-manager."""

    SERVICE: ClassVar[str] = "rollout-worker"
    MODULE: ClassVar[str] = "rollout_worker"

    worker_id: str = Field("", max_length=253, description="Unique worker id ('' = host-pid).")
    pool: Literal["reserved", "spot"] = Field("reserved", description="Worker pool: 'reserved' or 'spot'.")
    variant: str = Field(
        "",
        max_length=20,
        pattern=r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Spot variant (rollout.spot.variants) whose capacity and tensorParallel it takes ('' = the pool's).",
    )
    node: str = Field("", max_length=253, description="Node name for preemption notices ('' = this host's name).")
    manager: HostPort = Field(DEFAULT_MANAGER_ADDRESS, description="The rollout-manager's HOST:PORT.")
    weight_server: str = Field("", description="The weight-server's URL ('' = the model directory's weights).")
    model_dir: str = Field("", description="HF model directory (config.json + *.safetensors); required.")
    metrics_port: Port = Field(0, description="/metrics and /healthz port (0 = off).")
    capacity: int = Field(0, ge=0, le=100000, description="Concurrent requests (0 = the pool's capacity in the spec).")
    engine: Literal["", "torch", "sglang"] = Field("", description="Engine: 'torch' or 'sglang' ('' = the spec's).")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Compute dtype: 'float32' or 'bfloat16'.")
    device: str = Field("cpu", min_length=1, description="Torch device (cpu, cuda, cuda:1...).")
    identity_token_file: str = Field(
        "",
        max_length=4096,
        description="File holding this worker's identity proof, read at each registration ('' = none; required "
        "by a manager with credentials): the projected service-account token on Kubernetes.",
    )
    startup_timeout: float = Field(120, gt=0, description="Seconds to wait for the weight-server's first version.")
    reconnect_timeout: float = Field(60, gt=0, description="Give up when the manager stays unreachable this long (s).")
    drain_deadline_ms: int = Field(10000, ge=0, le=3_600_000, description="Deadline announced in the DrainNotice.")
    peer_port: int = Field(
        -1, ge=-1, le=65535, description="Port serving the weights held to other workers (0 = any free, -1 = off)."
    )
    peer_advertise: str = Field(
        "", max_length=253, pattern=r"^[A-Za-z0-9.:\[\]-]*$", description="Host peers reach it at ('' = --host)."
    )
    zone: str = Field("", pattern=r"^[A-Za-z0-9._-]{0,63}$", description="This worker's zone (peer fan-out).")
    region: str = Field("", pattern=r"^[A-Za-z0-9._-]{0,63}$", description="This worker's region (peer fan-out).")


def worker_options(
    site: Site,
    worker_id: str,
    pool: str,
    node: str,
    model_dir: Path | str,
    metrics_port: int,
    accelerated: bool = False,
    peer_port: int = -1,
    variant: str = "",
) -> WorkerOptions:
    """`accelerated`: the pool has accelerators (gpusPerWorker >= 1): the engine runs on CUDA in bf16;
    `peer_port`: serve the weights held to other workers (0 = any free port, -1 = off); `variant`: a spot variant's
    name ('' = none)."""
    device = {"device": "cuda", "dtype": "bfloat16"} if accelerated else {}
    return WorkerOptions(
        **site.common(),
        worker_id=worker_id,
        pool=pool,
        node=node,
        manager=site.manager_address,
        weight_server=site.weight_server_url,
        model_dir=str(model_dir),
        metrics_port=metrics_port,
        **device,
        **({"peer_port": peer_port} if peer_port >= 0 else {}),
        **({"variant": variant} if variant else {}),
    )
