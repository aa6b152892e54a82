"""Resume and checkpoint cadence, rank 0's side of trainer.checkpoint: which checkpoint a run continues from (and
whether it fits this job), when a step writes one, the TrainerState it holds, and the step report a resumed run
sends again.

A checkpoint is written after its step's weights are published, every `trainer.checkpointEvery` steps and after the
last one (the collective save: trainer.checkpoint.save, on every rank). It holds its step's report: a trainer killed
between the checkpoint and the report's publication sends it again on resume, unless the mark beside the checkpoint
says it went out; a step's evaluation, done after the checkpoint, lies beside it too.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlboost.spec import JobSpec
from rlboost.wire.events import STEPS, StepReport, ValidationReport
from trainer import ranks

if TYPE_CHECKING:
    from trainer.checkpoint import TrainerState
    from trainer.job_events import JobEvents

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoint directory as the step loop sees it: resume point, save cadence, reported marks."""

    def __init__(self, spec: JobSpec, directory: Path | None, resume: bool, steps: int) -> None:
        self.spec, self.directory, self.resume, self.steps = spec, directory, resume, steps
        self.last_report: dict | None = None  # the resumed checkpoint's step report, to publish again

    def resume_point(self, dataset_rows: int) -> tuple[Path, TrainerState] | None:
        """The checkpoint to continue from and its state (None: start fresh); CheckpointError when it does not fit
        this job. Keeps its step report to send again (see `resend_last_report`)."""
        from trainer.checkpoint import latest_valid, reported_marker

        if not (self.resume and self.directory):
            return None
        found = latest_valid(self.directory)
        if found is None:
            log.warning("no valid checkpoint: starting from scratch", extra={"dir": str(self.directory)})
            return None
        path, st = found
        self._check_fits(path, st, dataset_rows)
        self.last_report = None if reported_marker(path).exists() else with_validation(st.last_report, path)
        return path, st

    def _check_fits(self, path: Path, st: TrainerState, dataset_rows: int) -> None:
        from trainer.checkpoint import CheckpointError

        want = {
            "world_size": ranks.world_size(),
            "zero_stage": self.spec.trainer.zero_stage,
            "task_seed": self.spec.task.seed,
            "prompts_per_step": self.spec.algorithm.prompts_per_step,
        }
        for key, value in want.items():
            if getattr(st, key) != value:
                raise CheckpointError(
                    f"checkpoint {path} was written with {key}={getattr(st, key)}, this job has {value}; "
                    "resume with the same trainer.ranks, trainer.zeroStage, task.seed and algorithm.promptsPerStep"
                )
        if st.dataset_rows != dataset_rows:
            raise CheckpointError(
                f"checkpoint {path} was written for a task.dataset.train of {st.dataset_rows} rows, this job's has "
                f"{dataset_rows}: the order would differ; resume with the same dataset or start fresh"
            )

    def save_due(self, steps_done: int, data_ends: bool) -> bool:
        """Whether the step after `steps_done` steps writes a checkpoint: every checkpointEvery steps, and the
        last step (of the run, or of the data)."""
        last = steps_done + 1 == self.steps or data_ends
        every = self.spec.trainer.checkpoint_every
        return self.directory is not None and ((steps_done + 1) % every == 0 or last)

    def state(
        self,
        steps_done: int,
        version: int,
        checksum: str,
        data_cursor: dict[str, int],
        dataset_rows: int,
        carried_groups: list[dict[str, Any]] | None,
    ) -> TrainerState:
        """What a checkpoint after `steps_done` steps records, to continue exactly there."""
        from trainer.checkpoint import TrainerState

        return TrainerState(
            steps_done=steps_done,
            weight_version=version,
            weights_checksum=checksum,
            world_size=ranks.world_size(),
            zero_stage=self.spec.trainer.zero_stage,
            task_seed=self.spec.task.seed,
            prompts_per_step=self.spec.algorithm.prompts_per_step,
            data_cursor=data_cursor,
            dataset_rows=dataset_rows,
            carried_groups=carried_groups,
        )

    def write(self, engine: Any, state: TrainerState) -> None:
        """Collective (every rank, in a thread): the checkpoint of `state` (trainer.checkpoint.save)."""
        from trainer import checkpoint

        assert self.directory is not None
        checkpoint.save(engine, self.directory, state, self.spec.trainer.keep_checkpoints)

    def mark_reported(self, step: int) -> None:
        """The step's report is out (acknowledged by the status stream, when there is one): its checkpoint, if the
        step wrote one, need not send it again on resume."""
        from trainer.checkpoint import reported_marker, tag_of

        if self.directory is not None and (ckpt := self.directory / tag_of(step + 1)).is_dir():
            reported_marker(ckpt).touch()

    def keep_validation(self, step: int, validation: ValidationReport | None) -> None:
        """Beside the step's checkpoint (if it wrote one): a report sent again on resume carries its evaluation."""
        from rlboost.fsio import write_text_atomic
        from trainer.checkpoint import WHERE, tag_of, validation_file

        if validation is None or self.directory is None:
            return
        if (ckpt := self.directory / tag_of(step + 1)).is_dir():
            write_text_atomic(validation_file(ckpt), validation.model_dump_json(), "step evaluation", WHERE)

    async def resend_last_report(self, events: JobEvents) -> None:
        """The report of the step the checkpoint ended, published again when no mark says it went out: the trainer
        may have been killed between the checkpoint and the report's publication. Readers keep one report per step
        (a redelivery counts once)."""
        if self.last_report is None:
            return
        record = StepReport.model_validate(self.last_report)
        await events.publish(STEPS, record)
        log.info("step report sent again after resuming", extra={"step": record.step})


def with_validation(report: dict | None, checkpoint: Path) -> dict | None:
    """A checkpoint's step report with the evaluation written beside it, if there was one (validation_file)."""
    from trainer.checkpoint import validation_file

    path = validation_file(checkpoint)
    if report is None or not path.is_file():
        return report
    return report | {"validation": json.loads(path.read_text())}
