"""NATS subjects and event payloads (JSON), shared by every publisher and subscriber.

Subjects are per job: `rlboost.<namespace>.<job>.<topic>`. The topics are one typed table at the end of this
file, each paired with the payload its messages carry (`WEIGHTS.subject(namespace, job)`, `WEIGHTS.encode(event)`,
`WEIGHTS.decode(data)`); publishers, subscribers and the NATS permissions (rlboost.auth.nats_config) name them
from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

STATUS_STREAM = "RLBOOST_STATUS"  # JetStream stream the operator keeps each job's newest step report and `done` in
TRAINER_INBOX = "_INBOX.trainer"  # the trainer's reply subjects (nats.connect inbox_prefix): the stream's acks
SUBJECT = "rlboost.{namespace}.{job}.{topic}"

Payload = TypeVar("Payload", bound=BaseModel)


@dataclass(frozen=True)
class Topic(Generic[Payload]):
    """One topic of a job's NATS subjects and the payload type every message on it carries (JSON)."""

    name: str
    payload: type[Payload]

    def subject(self, namespace: str, job: str) -> str:
        """`rlboost.<namespace>.<job>.<name>`; "*" for the namespace or job: that topic of every one."""
        return SUBJECT.format(namespace=namespace, job=job, topic=self.name)

    def carries(self, subject: str) -> bool:
        """Whether `subject` is this topic's (of whichever job)."""
        return subject.rsplit(".", 1)[-1] == self.name

    def encode(self, event: Payload) -> bytes:
        return event.model_dump_json().encode()

    def decode(self, data: bytes) -> Payload:
        """A message's payload; pydantic's ValidationError (a ValueError) for bytes that are not one."""
        return self.payload.model_validate_json(data)


class WeightsAnnounced(BaseModel):
    """topic `weights`: a new version is on the weight-server."""

    version: int = Field(ge=0)
    checksum: str
    kind: Literal["full", "delta"] = Field(description="'full' or 'delta'.")


class PreemptionNotice(BaseModel):
    """topic `nodes`: a node (or worker) is about to go away; drain what runs there."""

    node: str = ""
    workers: list[str] = Field(default_factory=list, description="Worker ids (pod names) on that node.")
    reason: str = ""
    deadline_s: float = Field(
        30.0, ge=0, allow_inf_nan=False, description="Seconds until the node is expected to vanish."
    )


GAUGE_KEY = "gauge"  # json_schema_extra key of a StepReport field exported as a trainer gauge


def gauge(default: Any, description: str, *, name: str = "", **constraints: Any) -> Any:
    """A StepReport field the trainer also exports as the gauge `rlboost_trainer_<name or the field's name>`,
    set to the field's value after every step; the description is the gauge's help."""
    return Field(default, description=description, json_schema_extra={GAUGE_KEY: name or True}, **constraints)


class ValidationReport(BaseModel):
    """An evaluation on the validation prompts at a step's weights (spec.evaluation; rlboost.evaluation): part of
    that step's StepReport, the trainer's validation gauges and `validation[]` of the local JSON report."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    step: int = Field(ge=0, description="The optimizer step after which it ran (0-based).")
    weight_version: int = Field(ge=0, description="Weight version the responses were generated with.")
    reward_mean: float = Field(description="Mean reward (task.reward) over every validation response.")
    pass_at_1: float = Field(ge=0, le=1, description="Unbiased pass@1 (Codex paper), mean over prompts.")
    pass_at_k: float = Field(ge=0, le=1, description="Unbiased pass@k, k = evaluation.samples, mean over prompts.")
    k: int = Field(ge=1, description="Responses per prompt (evaluation.samples).")
    prompts: int = Field(ge=0, description="Validation prompts evaluated.")
    response_tokens_mean: float = Field(0.0, ge=0, description="Mean response length in tokens.")
    reward_failures: int = Field(0, ge=0, description="Responses whose reward call failed (scored 0).")
    seconds: float = Field(0.0, ge=0, description="Wall time of the evaluation (rollout and scoring).")


class StepReport(BaseModel):
    """The one record of a step: topic `steps` (trainer -> operator, `rlboost local`), a line of the trainer's
    run_dir/steps.jsonl, the trainer's per-step gauges (`step_gauges()`), and `steps[]` of the local JSON report.

    Adding a metric is adding one field here: the trainer fills it; declared with `gauge(...)` it is also a
    Prometheus gauge. Values computed from the model (loss, norms, KL) carry no bounds: a NaN is reported, not
    rejected. Time split of a step: rollout = request to last trajectory, train = last trajectory to
    optimizer step done (training overlapped with rollout is not counted twice), sync = weight publication.
    """

    # A NaN loss is written as NaN (as json.dumps does), not null: the record still parses and shows it.
    model_config = ConfigDict(ser_json_inf_nan="constants")

    step: int = Field(ge=0, description="Optimizer step (0-based, as the trainer numbers it).")
    weight_version: int = gauge(..., "Weight version published after the step.", ge=0)
    weights_checksum: str = Field(description="Checksum of the whole published state at weight_version.")
    reward_mean: float = gauge(..., "Mean reward of the step's samples.")
    reward_std: float = gauge(0.0, "Spread (population standard deviation) of the step's rewards.")
    loss: float = gauge(0.0, "GRPO clipped policy loss of the step.")
    grad_norm: float = gauge(0.0, "Global gradient norm of the step, before clipping.")
    learning_rate: float = gauge(0.0, "Learning rate of the step.", ge=0)
    tokens: int = Field(ge=0, description="Response tokens generated for the step.")
    trajectories: int = Field(0, ge=0, description="Trajectories the step trained on.")
    rollout_seconds: float = Field(ge=0, description="Rollout request to the step's last trajectory.")
    train_seconds: float = Field(ge=0, description="Last trajectory to the optimizer step done.")
    sync_seconds: float = Field(
        ge=0, description="Optimizer step done to the weights published (with the colocation resume, a checkpoint)."
    )
    train_compute_seconds: float = gauge(
        0.0, "Rank 0's forward/backward + optimizer time of the step.", name="compute_seconds", ge=0
    )
    trainer_idle_seconds: float = gauge(
        0.0,
        "Rank 0's time without compute between the rollout request and the optimizer step.",
        name="idle_seconds",
        ge=0,
    )
    first_trajectory_seconds: float = Field(0.0, ge=0, description="Rollout request to the first trajectory.")
    clip_fraction: float = gauge(0.0, "Fraction of response tokens whose importance ratio was clipped.", ge=0, le=1)
    logprob_abs_diff: float = gauge(
        0.0,
        "Mean |log-prob - old log-prob| per response token: the ratio's log, 0 on on-policy rows at a step's first "
        "update; the trainer/worker gap is logprob_mismatch_mean.",
    )
    kl: float = gauge(0.0, "Mean k3 KL to the reference policy per response token (0 without klCoef).")
    entropy: float = gauge(0.0, "Mean policy entropy per response token.")
    off_policy: int = Field(0, ge=0, description="Samples skipped for being older than algorithm.maxStaleness.")
    stale: int = Field(0, ge=0, description="Samples accepted within algorithm.maxStaleness, importance-corrected.")
    carried_over: int = Field(
        0, ge=0, description="algorithm.partialRollout: samples still in flight at the step's end, continued next step."
    )
    stale_tokens: int = Field(
        0, ge=0, description="Response tokens trained on that were generated under an older weight version."
    )
    ranks: int = Field(1, ge=1, description="Trainer ranks that took the step.")
    colocation_released: int = Field(
        0, ge=0, description="trainer.colocateReserved: reserved workers that acked the release for this step."
    )
    colocation_resumed: int = Field(
        0, ge=0, description="...and that acked the resume once the step's weights were out."
    )
    colocation_wait_seconds: float = Field(0.0, ge=0, description="Trainer time waiting for the release acks.")
    finish_reasons: dict[str, int] = Field(
        default_factory=dict, description="Trajectories per finish reason ('stop', 'length', ...)."
    )
    response_length: dict[str, float] = Field(
        default_factory=dict, description="Response length in tokens of the step's samples: p50, p90, max."
    )
    sync_bytes: int = Field(0, ge=0, description="Bytes of the step's weight publication (delta or snapshot).")
    pool_tokens_per_second: dict[str, float] = Field(
        default_factory=dict,
        description="Tokens generated per second by each pool's workers since the previous step (manager status).",
    )
    pool_workers: dict[str, int] = Field(default_factory=dict, description="Workers per pool at the step's end.")
    spot_busy_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of the spot workers' time since the previous step in which they held at "
        "least one request (manager status); with trainer_idle_seconds the input of rollout.spot.sizing 'busy'.",
    )
    workers_lost: int = Field(
        0, ge=0, description="Workers gone from the manager since the previous step (preempted, crashed, drained)."
    )
    migrations: int = Field(0, ge=0, description="Requests the manager moved to another worker, job total so far.")
    cost_so_far: float = Field(
        0.0, ge=0, description="USD at spec.prices for the accelerators in use, since the trainer process started."
    )
    prompts_skipped: int = Field(
        0, ge=0, description="Dataset prompts skipped while taking the step's batch: longer than maxPromptTokens."
    )
    data_epoch: int = Field(
        0, ge=0, description="Epoch of the data cursor after the step's prompts (the epoch the next step reads)."
    )
    # The trainer/sampler gap and the GRPO-family variants (algorithm.rolloutCorrection, ...: docs/algorithms.md)
    logprob_mismatch_mean: float = gauge(
        0.0,
        "Mean |trainer log-prob - worker log-prob| per response token of the rows that carry the workers' "
        "log-probs, the trainer's at the step's weights before its update.",
    )
    logprob_mismatch_max: float = gauge(0.0, "Largest |trainer log-prob - worker log-prob| of those tokens.")
    rollout_correction_fraction: float = gauge(
        0.0,
        "Fraction of response tokens whose rollout-correction weight went past algorithm.rolloutCorrection.cap "
        "(truncated, or masked).",
        ge=0,
        le=1,
    )
    baseline_excluded: int = Field(
        0, ge=0, description="Samples kept out of their group's baseline: dropped, reward failed or too stale."
    )
    validation: ValidationReport | None = Field(
        None, description="The evaluation after this step (every evaluation.everySteps and the last), else null."
    )
    # ---- agentic episodes (task.environment; issue 33): zeros for single-turn samples ----
    episode_turns_mean: float = gauge(0.0, "Mean model turns per episode of the step.", name="episode_turns", ge=0)
    episode_turns_max: int = Field(0, ge=0, description="Most model turns of one episode of the step.")
    tool_calls: int = Field(0, ge=0, description="Tool calls the step's episodes made.")
    tool_failures: int = Field(
        0, ge=0, description="Tool calls of the step's episodes that failed (malformed, unknown tool, the tool raised)."
    )
    tool_latency_seconds: float = gauge(
        0.0, "Mean wall time of one environment call (reset or a step with its tools) in the step's episodes.", ge=0
    )
    environment_failures: int = Field(
        0, ge=0, description="Episodes of the step that failed in their environment (crash, timeout, ...)."
    )
    env_runner_utilisation: float = gauge(
        0.0, "Episodes the env-runners drove as a share of their capacity, at the step's end.", ge=0, le=1
    )
    idle_slot_seconds_in_tools: float = gauge(
        0.0,
        "Free worker slot-seconds while episodes were in their tools and no request was pending, since the "
        "previous step (engine capacity that waited for environments).",
        ge=0,
    )
    # issue 31: a failed reward call is a kind of failure, not a real zero (rlboost.tasks.sandbox.FAILURE_REASONS)
    reward_failures: dict[str, int] = Field(
        default_factory=dict,
        description="The step's samples whose reward call failed, per kind ('timeout': past task.rewardTimeoutSeconds, "
        "'budget': cut or not started within task.rewardStepBudgetSeconds, 'crash', 'cpu', 'memory', ...): "
        "scored 0, left out of reward_mean and of their group's baseline.",
    )
    # ---- what preemptions cost (issue 34): the rollout-manager's ledger (rollout_manager/preemption_costs.py),
    # read from its status after each step, as differences since the previous step ----
    preemptions: int = Field(
        0,
        ge=0,
        description="Rollout workers preempted since the previous step while holding running requests "
        "(after a notice, a silent death or an expired lease).",
    )
    preempted_slot_seconds: float = gauge(
        0.0,
        "Request slot-seconds lost to preemptions since the previous step: each moved request's time from its last "
        "token kept to its next token on another worker (a silent death's detection included).",
        ge=0,
    )
    rollout_slot_seconds: float = gauge(
        0.0, "Request slot-seconds the rollout workers held since the previous step (their capacity x time).", ge=0
    )
    preempted_slot_share: float = gauge(
        0.0,
        "preempted_slot_seconds / rollout_slot_seconds: the share of the step's rollout capacity preemptions cost "
        "(capped at 1).",
        ge=0,
        le=1,
    )

    @model_validator(mode="after")
    def _finite_seconds(self) -> StepReport:
        """Durations are measured, so finite: a non-finite one is a malformed report (a NaN loss is not)."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name.endswith("_seconds") and isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name}: {value} is not a duration; a step report's seconds are finite")
        return self


def step_gauges() -> dict[str, tuple[str, str]]:
    """StepReport's gauge fields: field name -> (metric name, help)."""
    out = {}
    for field_name, info in StepReport.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if GAUGE_KEY in extra:
            suffix = extra[GAUGE_KEY] if isinstance(extra[GAUGE_KEY], str) else field_name
            out[field_name] = (f"rlboost_trainer_{suffix}", info.description or field_name)
    return out


class JobDone(BaseModel):
    """topic `done`: the trainer finished all steps (or failed)."""

    ok: bool
    steps: int = Field(ge=0)
    final_weights_checksum: str = ""
    error: str = ""
    export_path: str = Field("", description="Where the trained policy was exported (spec.export.path), or ''.")


COLOCATION_RELEASE = "release"
COLOCATION_RESUME = "resume"


class ColocationCommand(BaseModel):
    """topic `colocation` (trainer -> colocated reserved workers, `trainer.colocateReserved`).

    `release` after step `step`'s rollout batch is complete: stop taking work, free engine memory, ack.
    `resume` after the step trained and its weights were published: take the memory back, ack, then sync to
    the newest announced weight version before taking work again."""

    step: int = Field(ge=0, description="Trainer step the command belongs to.")
    action: str = Field(description="'release' or 'resume'.")
    weight_version: int = Field(0, ge=0, description="Weight version published last (resume: the step's new version).")


class ColocationAck(BaseModel):
    """topic `colocation-acks` (worker -> trainer): one per worker and command."""

    step: int = Field(ge=0, description="Step of the command acknowledged.")
    action: str = Field(description="'release' or 'resume'.")
    worker_id: str = Field(description="The acknowledging worker.")
    ok: bool = Field(True, description="False: the engine could not release/resume; `error` says why.")
    error: str = Field("", description="Why it failed (empty when ok).")
    released: bool = Field(description="Whether the engine's memory is released after the command.")
    nbytes: int = Field(0, ge=0, description="Engine bytes freed (release) or allocated again (resume).")
    seconds: float = Field(0.0, ge=0, allow_inf_nan=False, description="Time the engine took.")
    weight_version: int = Field(0, ge=0, description="Weight version the engine holds.")
    mac: str = Field(
        "",
        max_length=128,
        description="HMAC of the other fields with the worker's own ack key (rlboost.auth."
        "colocation_acks); '' from a worker without one (a job without credentials).",
    )


class SuspendRequest(BaseModel):
    """topic `suspend` (operator -> trainer, a NATS request the trainer answers): checkpoint at the end of the step in
    progress and start no other step (spec.suspend, a Kueue preemption). Asked again until the answer says done."""

    reason: str = Field("", max_length=256, description="Why, for the trainer's log (e.g. 'spec.suspend').")


class SuspendReply(BaseModel):
    """The trainer's answer to each SuspendRequest."""

    checkpointed: bool = Field(
        description="True: a checkpoint holds every step taken (steps_done) and no step will start; False: the "
        "trainer checkpoints at the end of the step in progress (or, asked after that step's checkpoint decision, "
        "of the next one); ask again."
    )
    steps_done: int = Field(ge=0, description="Steps taken so far (those in the checkpoint, once checkpointed).")
    weights_checksum: str = Field("", description="Checksum of the newest published weights.")


# The topics of a job: each subject and what it carries (who may publish and subscribe: rlboost.auth.nats_config).
WEIGHTS = Topic("weights", WeightsAnnounced)  # weight-server -> workers: a new version to pull
NODES = Topic("nodes", PreemptionNotice)  # operator -> manager: drain what runs on a node about to go
STEPS = Topic("steps", StepReport)  # trainer -> operator, `rlboost local`: the record of each step
DONE = Topic("done", JobDone)  # trainer -> operator, `rlboost local`: the job's end
COLOCATION = Topic("colocation", ColocationCommand)  # trainer -> colocated reserved workers: release, resume
COLOCATION_ACKS = Topic("colocation-acks", ColocationAck)  # those workers -> trainer: one ack per command
SUSPEND = Topic("suspend", SuspendRequest)  # operator -> trainer (a request; the answer is a SuspendReply)
TOPICS: tuple[Topic[Any], ...] = (WEIGHTS, NODES, STEPS, DONE, COLOCATION, COLOCATION_ACKS, SUSPEND)
STATUS_TOPICS = (STEPS, DONE)  # what a job's status is made of: kept in STATUS_STREAM, the newest per job
