"""The rollout-manager's options, and the pure rendering of them for one deployment."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from rlboost.options.base import LOOPBACK, Port, ServiceOptions, Site

MANAGER_PORT = 50051


class ManagerOptions(ServiceOptions):
    """The rollout-manager: the single scheduler of rollout work (gRPC)."""

    SERVICE: ClassVar[str] = "rollout-manager"
    MODULE: ClassVar[str] = "rollout_manager"

    port: Port = Field(MANAGER_PORT, description="gRPC port (0 = any free port).")
    metrics_port: Port = Field(9101, description="/metrics and /healthz port (0 = off).")
    nats_wait: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="Seconds to keep trying to reach NATS at start-up (it may start after us, or its name may not "
        "resolve yet), with back-off, before giving up.",
    )
    offload_window: float | None = Field(
        None,
        ge=0,
        le=3600,
        description="Initial adaptive offload window T in seconds; 0 = never offload reserved work "
        "(unset: the job spec's rollout.offloadWindowS).",
    )
    balance_interval: float = Field(1.0, gt=0, le=3600, description="Seconds between balancing passes.")
    register_timeout: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Seconds a worker stream may stay open without its first message (Register); then it is "
        "closed (DEADLINE_EXCEEDED), so idle streams hold nothing.",
    )


DEFAULT_MANAGER_ADDRESS = f"{LOOPBACK}:{MANAGER_PORT}"  # what a worker or trainer dials when told nothing


def manager_options(site: Site, port: int, metrics_port: int) -> ManagerOptions:
    return ManagerOptions(**site.common(), port=port, metrics_port=metrics_port)
