"""Each step's one record (rlboost.wire.events.StepReport) and where it goes: a line of steps.jsonl, the step gauges
(trainer.metrics), the tracking backends of spec.logging, the log, and the job's `steps` event. Rank 0 only.

Time split of a step: rollout = request to last trajectory, train = last trajectory to optimizer step done
(training overlapped with rollout is not counted twice), sync = weight publication. `trainer_idle_seconds` = the
part of (request -> optimizer step done) in which rank 0 computed nothing: streamed consumption shrinks it (compare
`trainer.streamTraining: false`). Pool figures come from the manager's status after the step (trainer.pool_metrics).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rlboost.fsio import append_line
from rlboost.spec import JobSpec
from rlboost.wire.events import STEPS, StepReport
from rlboost.wire.rollout_io import ManagerStatus
from trainer import metrics, ranks
from trainer.episode_report import RunnerMeter, episode_fields
from trainer.grpo import LossStats, Sample
from trainer.job_events import JobEvents
from trainer.pool_metrics import PoolMeter, PoolStep, length_percentiles
from trainer.publisher import Published
from trainer.tally import StepTally
from trainer.training import Trained

log = logging.getLogger(__name__)


class StepReporter:
    """Makes each step's report and sends it everywhere it goes; keeps the pool meter and the trackers."""

    def __init__(self, spec: JobSpec, run_dir: Path, events: JobEvents) -> None:
        self.run_dir, self.events = run_dir, events
        self.pool_meter = PoolMeter(spec, time.monotonic())
        self.runner_meter = RunnerMeter()  # agentic episodes: env-runners' utilisation, idle slot-seconds
        self._runner_fields: dict[str, Any] = {}
        self.trackers: Any = None  # rlboost.tracking.Trackers of spec.logging, once opened

    def open_trackers(self, spec: JobSpec, job: str) -> None:
        """At start (rank 0): a backend that cannot work (a TrackingError) fails the start, not a step."""
        from rlboost.tracking import open_trackers

        self.trackers = open_trackers(spec.logging, self.run_dir, job)

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()

    def pools(self, status: ManagerStatus | None) -> PoolStep:
        """The manager's status after the step, as rates since the previous step's."""
        self._runner_fields = self.runner_meter.update(status)
        return self.pool_meter.update(status, time.monotonic())

    def record(
        self,
        step: int,
        samples: list[Sample],
        tally: StepTally,
        trained: Trained,
        published: Published,
        pools: PoolStep,
        data_epoch: int,
    ) -> StepReport:
        """The step's report; counts its off-policy, stale and published bytes in the counters."""
        result, loss, stats = trained.result, trained.loss, trained.stats
        counts, clock = tally.counts, tally.clock
        metrics.OFF_POLICY.inc(counts.off_policy)
        metrics.STALE.inc(counts.stale)
        metrics.BASELINE_EXCLUDED.inc(counts.baseline_excluded)
        metrics.PUBLISHED_BYTES.inc(published.nbytes)
        rewards = [s.reward for s in samples if s.reward_failure is None] or [0.0]  # a failed call is no zero
        n_tok = stats.tokens
        return StepReport(
            step=step,
            weight_version=published.version,
            weights_checksum=published.checksum,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            loss=loss,
            grad_norm=result.grad_norm,
            learning_rate=result.learning_rate,
            tokens=sum(len(s.trajectory.response_ids) for s in samples),
            trajectories=len(samples),
            rollout_seconds=clock.rollout_end - clock.start,
            train_seconds=clock.train_end - clock.rollout_end,
            sync_seconds=clock.sync_end - clock.train_end,
            train_compute_seconds=tally.sums.compute_s,
            first_trajectory_seconds=clock.first_trajectory or 0.0,
            clip_fraction=stats.clipped_tokens / n_tok if n_tok else 0.0,
            logprob_abs_diff=stats.abs_logp_diff_sum / n_tok if n_tok else 0.0,
            off_policy=counts.off_policy,
            stale=counts.stale,
            kl=stats.kl_sum / n_tok if n_tok else 0.0,
            entropy=stats.entropy_sum / n_tok if n_tok else 0.0,
            trainer_idle_seconds=max(0.0, (clock.train_end - clock.start) - tally.sums.compute_s),
            ranks=ranks.world_size(),
            finish_reasons=counts.finish_reasons,
            response_length=length_percentiles([len(s.trajectory.response_ids) for s in samples]),
            sync_bytes=published.nbytes,
            pool_tokens_per_second=pools.tokens_per_second,
            pool_workers=pools.workers,
            workers_lost=pools.workers_lost,
            migrations=pools.migrations,
            cost_so_far=pools.cost_so_far,
            spot_busy_fraction=pools.spot_busy_fraction,
            **pools.preemption,
            prompts_skipped=counts.skipped,
            data_epoch=data_epoch,
            carried_over=counts.carried_over,
            stale_tokens=counts.stale_tokens,
            **episode_fields(samples),
            **self._runner_fields,
            reward_failures=dict(Counter(s.reward_failure for s in samples if s.reward_failure)),
            **gap_fields(stats, counts.baseline_excluded),
        )

    async def report(self, r: StepReport) -> None:
        """The step's one record: a line of steps.jsonl, the step gauges, the trackers, the log, the `steps` event."""
        append_line(self.run_dir / "steps.jsonl", r.model_dump_json(), "step report", "the trainer's --run-dir")
        metrics.export_step(r)
        if self.trackers is not None:
            from rlboost.tracking import step_metrics

            await asyncio.to_thread(self.trackers.log, r.step, step_metrics(r))
        log.info(
            "step done",
            extra={
                "step": r.step,
                "reward_mean": round(r.reward_mean, 4),
                "loss": round(r.loss, 5),
                "weight_version": r.weight_version,
                "tokens": r.tokens,
                "rollout_s": round(r.rollout_seconds, 3),
                "train_s": round(r.train_seconds, 3),
                "sync_s": round(r.sync_seconds, 3),
            },
        )
        await self.events.publish(STEPS, r)


def gap_fields(stats: LossStats, excluded: int) -> dict[str, Any]:
    """The trainer/worker gap, the rollout correction and the baseline's exclusions of a step (StepReport fields)."""
    return {
        "logprob_mismatch_mean": stats.mismatch_sum / stats.mismatch_tokens if stats.mismatch_tokens else 0.0,
        "logprob_mismatch_max": stats.mismatch_max,
        "rollout_correction_fraction": stats.corrected_tokens / stats.tokens if stats.tokens else 0.0,
        "baseline_excluded": excluded,
    }
