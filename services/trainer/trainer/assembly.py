"""Step assembly: a step's prompts become a Rollout request, and its arriving trajectories (judged) become samples
and micro-batches. Two kinds of step share one shape (`StepAssembly`), so the trainer's step reads the same for
both:

- `WholeGroups` (this file): every group of the step is rolled out within it; micro-batches are released as their
  groups complete (trainer.batching), so training can stream beside the rollout;
- `PartialGroups` (trainer.partial_assembly, algorithm.partialRollout): groups stay in flight across steps; a step
  trains the groups complete when its stream ends.

Rank 0 only. The counts of what arrives go into the step's StepCounts (trainer.tally).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from rlboost.policies.partial_rollout import lag, trainable
from rlboost.spec import AlgorithmSpec, JobSpec, effective_micro_batch
from rlboost.tasks.sandbox import RewardResult
from rlboost.wire.rollout_io import EpisodeSettings, PromptItem, RolloutRequest, SamplingParams, Trajectory
from trainer import advantages, metrics
from trainer.batching import StepAssembler
from trainer.grpo import Sample
from trainer.judge import FAILED, Judge
from trainer.partial import episode_task
from trainer.prompt_cursor import PromptCursor
from trainer.rollout_client import RolloutError
from trainer.rollout_dump import RolloutDump
from trainer.rollout_stream import Progress
from trainer.tally import StepCounts
from trainer.vocabulary import Vocabulary


@dataclass(frozen=True)
class OpenedStep:
    """A step's Rollout request, with what its prompts' taking counted."""

    request: RolloutRequest
    skipped: int  # dataset prompts skipped for length while taking them
    sequences: int | None  # samples the step trains on, when known up front (whole groups); None: at its end


class StepAssembly(Protocol):
    """One kind of step (whole groups or partial rollout), as the trainer's step drives it."""

    streams: bool  # micro-batches may train while the rollout still streams

    @property
    def progress(self) -> Progress: ...

    def open(self, step: int, version: int, trains_at: int | None = None) -> OpenedStep | None: ...

    def fresh(self, batch: list[Trajectory]) -> list[Trajectory]: ...

    async def judged(self, batch: list[Trajectory]) -> list[RewardResult]: ...

    def add(self, batch: list[Trajectory], rewards: list[RewardResult], counts: StepCounts) -> list[list[Sample]]: ...

    def finish(self, counts: StepCounts) -> tuple[list[Sample], list[list[Sample]]]: ...

    def carried_groups(self) -> list[dict[str, Any]] | None: ...

    def resume(self, saved: list[dict[str, Any]] | None) -> None: ...


class WholeGroups:
    """Steps that roll out all of their groups: promptsPerStep prompts x groupSize samples, assembled into fixed
    micro-batches released in order as their groups complete."""

    def __init__(
        self, spec: JobSpec, prompts: PromptCursor, judge: Judge, vocab: Vocabulary, dump: RolloutDump
    ) -> None:
        self.spec, self.prompts, self.judge, self.vocab, self.dump = spec, prompts, judge, vocab, dump
        # streamed training, unless colocated (reserved workers must finish generating before training starts) or
        # the advantages need the whole step (trainer.advantages)
        alg = spec.algorithm
        self.streams = (
            spec.trainer.stream_training
            and not spec.trainer.colocate_reserved
            and not advantages.needs_whole_batch(alg)
        )
        self.request: RolloutRequest | None = None  # the current step's
        self.examples: list[Any] = []  # the current step's, by prompt index
        self.assembler: StepAssembler | None = None  # the current step's
        self.trains_at = 0  # the weight version the current step trains at: its samples' lag is counted from it

    @property
    def progress(self) -> Progress:
        assert self.assembler is not None
        return self.assembler

    def open(self, step: int, version: int, trains_at: int | None = None) -> OpenedStep | None:
        """The step's Rollout request at weight version `version`; None: the data is exhausted. `trains_at`: the version
        the step will train at when that is a later one (algorithm.rolloutAhead: its samples are then stale)."""
        alg = self.spec.algorithm
        batch = self.prompts.take_step(step)
        if batch is None:
            return None
        sampling = training_sampling(alg, self.vocab.stop_ids)
        self.request = RolloutRequest(step, version, [], alg.group_size, sampling, self.vocab.size)
        with_prompts(self.request, self.spec, batch.examples, batch.prompt_ids)
        self.examples = batch.examples
        self.trains_at = version if trains_at is None else trains_at
        mb, normalization = effective_micro_batch(self.spec), alg.advantage_normalization
        self.assembler = StepAssembler(step, len(batch.examples), alg.group_size, mb, normalization)
        return OpenedStep(self.request, batch.skipped, self.assembler.total)

    def fresh(self, batch: list[Trajectory]) -> list[Trajectory]:
        """The batch less what is already in (re-sent by a retried rollout: stepRetries), each checked to belong."""
        assert self.assembler is not None
        batch = [t for t in batch if not self.assembler.has(t)]
        for traj in batch:
            self.assembler.validate(traj)
        return batch

    async def judged(self, batch: list[Trajectory]) -> list[RewardResult]:
        assert self.request is not None
        return await self.judge.judge(self.request.step, self.examples, batch)

    def add(self, batch: list[Trajectory], rewards: list[RewardResult], counts: StepCounts) -> list[list[Sample]]:
        """Take judged trajectories; the micro-batches that became ready, in order."""
        assert self.assembler is not None and self.request is not None
        ready: list[list[Sample]] = []
        for traj, reward in zip(batch, rewards, strict=True):
            is_stale, weight = classify(self.trains_at, traj, self.spec.algorithm.max_staleness)
            counts.stale += is_stale
            counts.stale_tokens += older_tokens(traj, self.trains_at) if weight else 0
            counts.off_policy += weight == 0.0 and traj.finish_reason != FAILED
            excluded = advantages.exclusion(traj.finish_reason, reward.failure, weight)
            counts.baseline_excluded += bool(excluded)
            arrived(traj, counts, self.dump)
            ready += self.assembler.add(traj, reward.value, is_stale, weight, reward.failure, excluded)
        return ready

    def finish(self, counts: StepCounts) -> tuple[list[Sample], list[list[Sample]]]:
        """The step's samples once its stream ended (all of them, or RolloutError); no micro-batch is left over:
        every one was released by `add`."""
        assembler = self.assembler
        assert assembler is not None
        if not assembler.complete:
            raise RolloutError(
                f"rollout stream of step {assembler.step} ended with {assembler.received}/{assembler.total} "
                f"trajectories (first missing (prompt, sample): {assembler.missing()[:3]})"
            )
        return assembler.samples(), []

    def carried_groups(self) -> list[dict[str, Any]] | None:
        return None  # nothing is in flight between steps

    def resume(self, saved: list[dict[str, Any]] | None) -> None:
        pass  # nothing is in flight between steps


def with_prompts(request: RolloutRequest, spec: JobSpec, examples: list[Any], prompt_ids: list[list[int]]) -> None:
    """The request's prompts: their token ids, or (agentic episodes, task.environment) each example as the
    environment's task with the episodes' bounds (the environment makes each episode's prompt)."""
    if not spec.task.episodes:
        request.prompts = [PromptItem(i, ids) for i, ids in enumerate(prompt_ids)]
        return
    request.prompts = [PromptItem(i, [], episode_task(ex)) for i, ex in enumerate(examples)]
    request.episodes = EpisodeSettings(spec.algorithm.max_turns, spec.algorithm.max_episode_tokens)


def training_sampling(alg: AlgorithmSpec, stop_ids: tuple[int, ...]) -> SamplingParams:
    """The sampling of a training step's rollout."""
    return SamplingParams(
        temperature=alg.temperature,
        top_p=alg.top_p,
        top_k=0,
        max_new_tokens=alg.max_new_tokens,
        seed=alg.seed,
        stop_token_ids=stop_ids,
    )


def classify(version: int, traj: Trajectory, max_staleness: int) -> tuple[bool, float]:
    """(stale, loss weight) of a trajectory for a step training at weight version `version`: on-policy, stale within
    maxStaleness, or skipped."""
    if traj.finish_reason == FAILED:
        return False, 0.0
    behind = lag(version, traj.weight_version)  # its oldest token's (partial rollout)
    if not trainable(behind, max_staleness):
        return False, 0.0
    return behind > 0, 1.0


def arrived(traj: Trajectory, counts: StepCounts, dump: RolloutDump) -> None:
    """What every new trajectory of a step adds, whatever its kind: its finish reason, a drop, the dump."""
    counts.finished(traj.finish_reason)
    metrics.FAILED.inc(traj.finish_reason == FAILED)
    dump.write(traj)


def older_tokens(traj: Trajectory, version: int) -> int:
    """Model tokens generated under a version older than `version` (its spans, or all at its version); an
    episode's environment tokens (loss_mask 0) are no model's, and not counted."""
    spans = traj.version_spans or [(traj.weight_version, len(traj.response_ids))]
    n, at = 0, 0
    for v, k in spans:
        if v < version:
            n += sum(traj.loss_mask[at : at + k]) if traj.loss_mask else k
        at += k
    return n
