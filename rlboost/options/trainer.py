"""The trainer's options, and the pure rendering of them for one deployment."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, model_validator

from rlboost.options.base import HostPort, Port, ServiceOptions, Site
from rlboost.options.manager import DEFAULT_MANAGER_ADDRESS
from rlboost.options.weight_server import DEFAULT_WEIGHT_SERVER_URL


class TrainerOptions(ServiceOptions):
    """The DeepSpeed GRPO trainer: streams rollouts, publishes weights."""

    SERVICE: ClassVar[str] = "trainer"
    MODULE: ClassVar[str] = "trainer"

    manager: HostPort = Field(DEFAULT_MANAGER_ADDRESS, description="The rollout-manager's HOST:PORT.")
    weight_server: str = Field(DEFAULT_WEIGHT_SERVER_URL, min_length=1, description="The weight-server's base URL.")
    token_file: str = Field(
        "",
        description="Without --credentials-dir (a trainer run alone): file holding the weight-server's upload "
        "token. With it, the job's trainer token uploads.",
    )
    model_dir: str = Field("", description="HF model directory (fp32 weights); required.")
    metrics_port: Port = Field(0, description="/metrics and /healthz port (0 = off).")
    run_dir: str = Field("runs/trainer", min_length=1, description="steps.jsonl goes here.")
    steps: int | None = Field(None, ge=1, le=10**7, description="Override algorithm.steps.")
    dump_rollouts: str = Field("", description="Append every trajectory here as JSON lines ('' = off).")
    checkpoint_dir: str = Field("", description="Checkpoints go here ('' = none).")
    resume: bool = Field(False, description="Continue from the newest valid checkpoint in --checkpoint-dir.")
    connect_timeout: float = Field(30.0, gt=0, le=3600, description="Seconds to wait for NATS and the manager.")
    colocation_timeout: float = Field(
        120, gt=0, description="trainer.colocateReserved: seconds to wait for the reserved workers' acks."
    )

    @model_validator(mode="after")
    def _resume_needs_checkpoints(self) -> TrainerOptions:
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir (where the checkpoints are)")
        return self


def trainer_options(
    site: Site,
    model_dir: Path | str,
    run_dir: Path | str,
    metrics_port: int,
    dump_rollouts: Path | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
) -> TrainerOptions:
    chosen: dict[str, str | bool] = {}  # what is not chosen stays off the command line
    if dump_rollouts is not None:
        chosen["dump_rollouts"] = str(dump_rollouts)
    if checkpoint_dir is not None:
        chosen["checkpoint_dir"] = str(checkpoint_dir)
    if resume:
        chosen["resume"] = True
    return TrainerOptions(
        **site.common(),
        manager=site.manager_address,
        weight_server=site.weight_server_url,
        model_dir=str(model_dir),
        run_dir=str(run_dir),
        metrics_port=metrics_port,
        **chosen,
    )
