"""The env-runner's options (agentic episodes), and the pure rendering of them for one deployment."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from rlboost.options.base import HostPort, Port, ServiceOptions, Site
from rlboost.options.manager import DEFAULT_MANAGER_ADDRESS


class EnvRunnerOptions(ServiceOptions):
    """An env-runner: runs the job's environment (task.environment) and drives its episodes' turns through the
    rollout-manager."""

    SERVICE: ClassVar[str] = "env-runner"
    MODULE: ClassVar[str] = "env_runner"

    runner_id: str = Field("", max_length=253, description="Unique env-runner id ('' = host-pid).")
    node: str = Field("", max_length=253, description="Node name ('' = this host's name).")
    manager: HostPort = Field(DEFAULT_MANAGER_ADDRESS, description="The rollout-manager's HOST:PORT.")
    weight_server: str = Field(
        "", description="The weight-server's URL: the model's tokenizer and chat template come from it ('' = none)."
    )
    model_dir: str = Field(
        "", description="Directory with the model's tokenizer and chat template ('' = pulled from --weight-server)."
    )
    capacity: int = Field(
        0, ge=0, le=100000, description="Episodes driven at once (0 = the spec's rollout.envRunners.capacity)."
    )
    metrics_port: Port = Field(0, description="/metrics and /healthz port (0 = off).")
    startup_timeout: float = Field(120, gt=0, description="Seconds to wait for the model's assets (weight-server).")
    reconnect_timeout: float = Field(60, gt=0, description="Give up when the manager stays unreachable this long (s).")
    drain_timeout: float = Field(
        20, ge=0, le=3600, description="On SIGTERM: seconds the running episodes get to finish before it exits."
    )


def env_runner_options(
    site: Site, runner_id: str, node: str, model_dir: Path | str, metrics_port: int
) -> EnvRunnerOptions:
    """`model_dir` '' : the tokenizer is pulled from the site's weight-server (a pod without the model)."""
    return EnvRunnerOptions(
        **site.common(),
        runner_id=runner_id,
        node=node,
        manager=site.manager_address,
        weight_server=site.weight_server_url,
        model_dir=str(model_dir),
        metrics_port=metrics_port,
    )
