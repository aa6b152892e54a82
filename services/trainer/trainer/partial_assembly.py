"""Step assembly under partial rollout (algorithm.partialRollout): groups in flight across steps (trainer.partial).

A step opens new prompts up to the groups kept in flight, asks for the samples earlier groups still owe, and its
stream ends at the target of complete groups; the groups complete by then are trained (in canonical order, with
their staleness counted by their oldest token), the others stay in flight into the next step and the checkpoint.
Rank 0 only; the other kind of step and the shared shape: trainer.assembly.
"""

from __future__ import annotations

import logging
from typing import Any

from rlboost.policies.partial_rollout import new_groups
from rlboost.spec import JobSpec, effective_micro_batch
from rlboost.tasks.sandbox import RewardResult
from rlboost.wire.rollout_io import RolloutRequest, Trajectory
from trainer import advantages
from trainer.assembly import OpenedStep, arrived, classify, older_tokens, training_sampling, with_prompts
from trainer.grpo import Sample
from trainer.judge import FAILED, Judge
from trainer.partial import GroupCarry, OpenGroup
from trainer.prompt_cursor import PromptCursor
from trainer.rollout_client import RolloutError
from trainer.rollout_dump import RolloutDump
from trainer.rollout_stream import Progress
from trainer.tally import StepCounts
from trainer.vocabulary import Vocabulary

log = logging.getLogger(__name__)


class PartialGroups:
    """Steps that train the groups complete at their stream's end; the carry holds the others across steps."""

    streams = False  # a step's groups are known complete only when its stream ends

    def __init__(
        self, spec: JobSpec, prompts: PromptCursor, judge: Judge, vocab: Vocabulary, dump: RolloutDump
    ) -> None:
        self.spec, self.prompts, self.judge, self.vocab, self.dump = spec, prompts, judge, vocab, dump
        self.carry = GroupCarry(spec.algorithm.group_size, spec.task.episodes)  # every group in flight, across steps
        self.request: RolloutRequest | None = None  # the current step's

    @property
    def progress(self) -> Progress:
        return self.carry

    def open(self, step: int, version: int, trains_at: int | None = None) -> OpenedStep | None:
        """The step's Rollout: new prompts up to the groups kept in flight, the earlier groups' samples still owed,
        and the target of complete groups. None: the data is exhausted and nothing is in flight. (`trains_at`: the
        StepAssembly shape's; partial rollout is never run ahead, JobSpec refuses algorithm.rolloutAhead with it.)"""
        alg = self.spec.algorithm
        new = new_groups(self.spec.partial_rollout_groups(), len(self.carry))
        batch = self.prompts.peek(new) if new else None
        examples, ids = (batch.examples, batch.prompt_ids) if batch else ([], [])
        if not examples and not len(self.carry):
            return None
        if batch is not None:
            taken_at = self.prompts.cursor
            self.prompts.advance(batch)
            self.carry.open(step, examples, ids, taken_at)
        self.request = RolloutRequest(
            step,
            version,
            [],
            alg.group_size,
            training_sampling(alg, self.vocab.stop_ids),
            self.vocab.size,
            target_groups=alg.prompts_per_step,
            carried=self.carry.carried(step),
        )
        with_prompts(self.request, self.spec, examples, ids)  # episodes (task.environment): the tasks
        self.carry.start_stream(step)
        return OpenedStep(self.request, batch.skipped if batch else 0, None)

    def fresh(self, batch: list[Trajectory]) -> list[Trajectory]:
        """The batch less samples already in (re-sent by a retried rollout); CarryError for one of no group."""
        return [t for t in batch if self.carry.wants(t)]

    async def judged(self, batch: list[Trajectory]) -> list[RewardResult]:
        """Rewards of trajectories of any groups in flight: judged per step, whose examples they index."""
        rewards: dict[str, RewardResult] = {}
        for origin in sorted({t.step for t in batch}):
            part = [t for t in batch if t.step == origin]
            judged = await self.judge.judge(origin, self.carry.examples_of(origin), part)
            rewards.update((t.request_id, r) for t, r in zip(part, judged, strict=True))
        return [rewards[t.request_id] for t in batch]

    def add(self, batch: list[Trajectory], rewards: list[RewardResult], counts: StepCounts) -> list[list[Sample]]:
        """Take judged trajectories into their groups; none is trained before the stream ends."""
        for traj, reward in zip(batch, rewards, strict=True):
            arrived(traj, counts, self.dump)
            self.carry.add(traj, reward)
        return []

    def finish(self, counts: StepCounts) -> tuple[list[Sample], list[list[Sample]]]:
        """The complete groups' samples and their micro-batches; RolloutError when no group completed."""
        assert self.request is not None
        samples = self._complete_groups(self.request, self.carry.take_complete(), counts)
        if not samples:
            raise RolloutError(
                f"rollout stream of step {self.request.step} ended with no complete group ({self.carry.owed()} owed)"
            )
        counts.carried_over = self.carry.owed()
        mb = effective_micro_batch(self.spec)
        return samples, [samples[i : i + mb] for i in range(0, len(samples), mb)]

    def _complete_groups(self, request: RolloutRequest, groups: list[OpenGroup], counts: StepCounts) -> list[Sample]:
        """The complete groups' samples with their advantages (trainer.advantages) and staleness (lag of their
        oldest token), in order."""
        alg, ordered = self.spec.algorithm, []
        for group in groups:
            members = [group.samples[g] for g in range(alg.group_size)]
            ordered.append([self._sample(request, traj, reward, counts) for traj, reward in members])
        advantages.assign(ordered, alg.advantage_normalization)
        return [s for group in ordered for s in group]

    def _sample(self, request: RolloutRequest, traj: Trajectory, reward: RewardResult, counts: StepCounts) -> Sample:
        is_stale, weight = classify(request.weight_version, traj, self.spec.algorithm.max_staleness)
        counts.stale += is_stale
        counts.off_policy += weight == 0.0 and traj.finish_reason != FAILED
        counts.stale_tokens += older_tokens(traj, request.weight_version) if weight else 0
        excluded = advantages.exclusion(traj.finish_reason, reward.failure, weight)
        counts.baseline_excluded += bool(excluded)
        return Sample(
            traj, reward.value, stale=is_stale, weight=weight, reward_failure=reward.failure, excluded=excluded
        )

    def carried_groups(self) -> list[dict[str, Any]] | None:
        """Where each group still in flight took its prompt (the checkpoint's TrainerState.carried_groups)."""
        return self.carry.checkpoint()

    def resume(self, saved: list[dict[str, Any]] | None) -> None:
        """The checkpoint's groups in flight, rolled out afresh (see trainer.partial)."""
        if saved:
            self.carry.restore(saved, self.prompts.stream)
            log.info("groups in flight at the checkpoint are rolled out again", extra={"groups": len(self.carry)})
