"""NATS subjects and event payloads (JSON), shared by every publisher and subscriber.

Subjects are per job: `rlboost.<namespace>.<job>.<topic>`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


def subject(namespace: str, job: str, topic: str) -> str:
    """`rlboost.<namespace>.<job>.<topic>`; topics: weights, nodes, steps, done, colocation, colocation-acks."""
    return f"rlboost.{namespace}.{job}.{topic}"


class WeightsAnnounced(BaseModel):
    """topic `weights`: a new version is on the weight-server."""

    version: int
    checksum: str
    kind: str = Field(description="'full' or 'delta'.")


class PreemptionNotice(BaseModel):
    """topic `nodes`: a node (or worker) is about to go away; drain what runs there."""

    node: str = ""
    workers: list[str] = Field(default_factory=list, description="Worker ids (pod names) on that node.")
    reason: str = ""
    deadline_s: float = Field(30.0, description="Seconds until the node is expected to vanish.")


class StepReport(BaseModel):
    """topic `steps`: the trainer finished an optimizer step and published its weights."""

    step: int
    reward_mean: float
    reward_std: float = 0.0
    tokens: int = Field(description="Response tokens generated for this step.")
    rollout_seconds: float
    train_seconds: float
    sync_seconds: float
    weight_version: int
    weights_checksum: str
    loss: float = 0.0
    tokens_by_pool: dict[str, int] = Field(default_factory=dict)
    grad_norm: float = Field(0.0, description="Global gradient norm before clipping.")
    learning_rate: float = 0.0
    kl: float = Field(0.0, description="Mean k3 KL to the reference policy per response token (0 without klCoef).")
    entropy: float = Field(0.0, description="Mean policy entropy per response token.")
    train_compute_seconds: float = Field(0.0, description="Rank 0's forward/backward + optimizer time.")
    trainer_idle_seconds: float = Field(0.0, description="Rank 0's time without compute, request to optimizer step.")
    off_policy: int = Field(0, description="Samples skipped for being older than algorithm.maxStaleness.")
    stale: int = Field(0, description="Samples accepted within algorithm.maxStaleness.")
    ranks: int = Field(1, description="Trainer ranks.")
    colocation_released: int = Field(0, description="Colocated reserved workers that acked the release this step.")
    colocation_resumed: int = Field(0, description="Colocated reserved workers that acked the resume this step.")
    colocation_wait_seconds: float = Field(0.0, description="Trainer time waiting for the release acks this step.")


class JobDone(BaseModel):
    """topic `done`: the trainer finished all steps (or failed)."""

    ok: bool
    steps: int
    final_weights_checksum: str = ""
    error: str = ""


COLOCATION_RELEASE = "release"
COLOCATION_RESUME = "resume"


class ColocationCommand(BaseModel):
    """topic `colocation` (trainer -> colocated reserved workers, `trainer.colocateReserved`).

    `release` after step `step`'s rollout batch is complete: stop taking work, free engine memory, ack.
    `resume` after the step trained and its weights were published: take the memory back, ack, then sync to
    the newest announced weight version before taking work again."""

    step: int = Field(description="Trainer step the command belongs to.")
    action: str = Field(description="'release' or 'resume'.")
    weight_version: int = Field(0, description="Weight version published last (resume: the step's new version).")


class ColocationAck(BaseModel):
    """topic `colocation-acks` (worker -> trainer): one per worker and command."""

    step: int = Field(description="Step of the command acknowledged.")
    action: str = Field(description="'release' or 'resume'.")
    worker_id: str = Field(description="The acknowledging worker.")
    ok: bool = Field(True, description="False: the engine could not release/resume; `error` says why.")
    error: str = Field("", description="Why it failed (empty when ok).")
    released: bool = Field(description="Whether the engine's memory is released after the command.")
    nbytes: int = Field(0, description="Engine bytes freed (release) or allocated again (resume).")
    seconds: float = Field(0.0, description="Time the engine took.")
    weight_version: int = Field(0, description="Weight version the engine holds.")
