"""The JSON report of a local run (`rlboost local --json-report PATH`) and its reward plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from rlboost.wire.events import StepReport, ValidationReport
from rlboost.wire.rollout_io import ManagerStatus


class WorkerRecord(BaseModel):
    worker_id: str = Field(description="Worker id.")
    pool: str = Field(description="'reserved' or 'spot'.")
    weight_version: int = Field(description="Weight version the worker held at the end.")


class FaultRecord(BaseModel):
    """One process chaos killed (`rlboost local --chaos-kill-every S --chaos-targets ...`)."""

    role: str = Field(description="The chaos target: spot, reserved, manager, weight-server, nats or trainer.")
    process: str = Field(description="The child killed (its log is logs/<process>.log).")
    signal: str = Field(description="SIGKILL or SIGTERM.")
    at_seconds: float = Field(ge=0, description="Seconds from the start of training to the kill.")
    doing: str = Field(description="What the manager's status showed it doing when it was hit.")
    back_after_seconds: float | None = Field(
        None, ge=0, description="Seconds until the restarted process listened again (None: a spot worker, replaced)."
    )


class RestartRecord(BaseModel):
    """One child started again by the runner's supervision (rlboost.local.restarts), as a kubelet restarts a
    container: after it died (cause 'died'), after a chaos kill ('chaos'), or a spot worker replaced by a new one
    while a trace or chaos sizes the pool ('replaced')."""

    process: str = Field(description="The child (its log is logs/<process>.log).")
    role: str = Field(description="nats, weight-server, rollout-manager, rollout-worker or trainer.")
    cause: Literal["died", "chaos", "replaced"] = Field(description="Why it was started again.")
    ended: str = Field(description="How its process ended: 'SIGKILL', 'exit 1', ...")
    at_seconds: float = Field(ge=0, description="Seconds from the start of the run to its death being seen.")
    uptime_seconds: float = Field(ge=0, description="Seconds it had run since its (re)start.")
    backoff_seconds: float = Field(ge=0, description="Back-off waited before starting it again.")
    restarted_at_seconds: float | None = Field(None, ge=0, description="When it was started again (None: not yet).")
    back_after_seconds: float | None = Field(
        None, ge=0, description="Seconds from its death to answering its readiness probe again (None: not yet)."
    )


class LocalReport(BaseModel):
    """What a run did; `workers` is the manager's final status."""

    ok: bool = Field(True, description="The job finished all its steps.")
    steps: list[StepReport] = Field(
        default_factory=list, description="The trainer's record of each optimizer step, as published on NATS."
    )
    validation: list[ValidationReport] = Field(
        default_factory=list,
        description="Each evaluation on the validation prompts (spec.evaluation), in step order: step, reward_mean, "
        "pass_at_1, pass_at_k, k, response length.",
    )
    final_weights_checksum: str = Field(
        "", description="Checksum of the trainer's published weights (canonical order)."
    )
    preemptions: int = Field(0, description="Spot workers killed with SIGKILL (trace or chaos).")
    migrations: int = Field(0, description="Requests the manager moved to another worker.")
    migrations_by_reason: dict[str, int] = Field(
        default_factory=dict,
        description="Migrations per reason (stream_broken, drained, lease_expired, rebalance, offload, ...).",
    )
    tokens_lost: int = Field(
        0,
        description="Tokens a dead or revoked worker sent that did not end up in the response (the manager's "
        "rlboost_manager_tokens_lost_total); token-level migration keeps every received token, so 0.",
    )
    tokens_regenerated: int = Field(
        0,
        description="Tokens generated again for response positions the manager already held "
        "(rlboost_manager_tokens_regenerated_total); exact continuation makes it 0.",
    )
    tokens_received: int = Field(0, description="Response tokens the manager received and kept, over all steps.")
    spot_events: list[str] = Field(
        default_factory=list,
        description="Spot pool and chaos events in order: 'SIGKILL spot-1 (chaos, 3 running, ...)', 'restarted nats', ...",
    )
    faults: list[FaultRecord] = Field(default_factory=list, description="Every process chaos killed, in order.")
    restarts: list[RestartRecord] = Field(
        default_factory=list, description="Every child the runner started again (supervision, chaos), in order."
    )
    workers: list[WorkerRecord] = Field(default_factory=list, description="Workers registered at the end.")
    wall_seconds: float = Field(0.0, description="Wall time from the first child start to completion.")
    export_path: str = Field(
        "", description="Where the trainer exported the trained policy as a Hugging Face model directory, or ''."
    )
    error: str = Field("", description="Why the run failed (empty when ok).")


def workers_from_status(status: ManagerStatus | None) -> list[WorkerRecord]:
    if status is None:
        return []
    return [
        WorkerRecord(worker_id=w.worker_id, pool=w.pool.value, weight_version=w.weight_version) for w in status.workers
    ]


def counters_from_status(status: ManagerStatus | None) -> dict[str, Any]:
    """The report's manager counters, read from its typed status (none without one: the report says 0)."""
    if status is None:
        return {}
    return {
        "migrations": status.migrations,
        "migrations_by_reason": {reason: n for reason, n in sorted(status.migrations_by_reason.items()) if n},
        "tokens_lost": status.tokens_lost,
        "tokens_regenerated": status.tokens_regenerated,
        "tokens_received": status.tokens_received,
    }


def write_report(report: LocalReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report.model_dump_json(indent=2) + "\n")


def plot_rewards(steps: list[StepReport], path: Path) -> Path | None:
    """A PNG of mean reward per step (matplotlib, Agg backend); None when there is nothing to plot."""
    if not steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs, ys = [s.step for s in steps], [s.reward_mean for s in steps]
    ax.plot(xs, ys, marker="o", ms=3, lw=0.8, alpha=0.6, label="per step")
    window = min(10, len(ys))  # a step's mean is noisy (few prompts): show the trend too
    trend = [sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1]) for i in range(len(ys))]
    ax.plot(xs, trend, lw=2, label=f"mean of last {window}")
    ax.legend(loc="lower right")
    ax.set_xlabel("step")
    ax.set_ylabel("mean reward")
    ax.set_title("rlboost local: mean reward per step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
