"""The trainer's side of spec.export: when the published policy is written as a Hugging Face model directory, and
where (rlboost.export writes it). Rank 0 only.

At the end of training, and every export.everyCheckpoints x trainer.checkpointEvery steps (whether or not the trainer
writes checkpoints: a run without a checkpoint directory exports on the same steps); a periodic export goes beside
export.path, suffixed -step-<steps done>. A destination that cannot work fails the start, not the last step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from rlboost.spec import JobSpec
from trainer.vocabulary import Vocabulary

log = logging.getLogger(__name__)


class PolicyExport:
    """Exports the published weights on their due steps; remembers where the last export went."""

    def __init__(self, spec: JobSpec, steps: int, run_dir: Path, model_dir: Path, vocab: Vocabulary) -> None:
        self.spec, self.steps, self.run_dir, self.model_dir, self.vocab = spec, steps, run_dir, model_dir, vocab
        self.path = ""  # where the last export went (JobDone.export_path)

    def check(self) -> None:
        """At start: the final destination can be written (rlboost.export.ExportError naming export.path)."""
        from rlboost.export import check_export_path

        if self.spec.export.path:
            check_export_path(self.dest(self.steps))

    def due(self, steps_done: int) -> bool:
        exp = self.spec.export
        if not exp.path:
            return False
        period = exp.every_checkpoints * self.spec.trainer.checkpoint_every
        return steps_done == self.steps or (period > 0 and steps_done % period == 0)

    def dest(self, steps_done: int) -> str:
        """export.path at the end; beside it, suffixed -step-<steps done>, for a periodic export."""
        from rlboost.export import resolve_export_path

        dest = resolve_export_path(self.spec.export.path, self.run_dir).rstrip("/")
        return dest if steps_done == self.steps else f"{dest}-step-{steps_done:08d}"

    def write(self, state: dict[str, Any], steps_done: int) -> None:
        """In a thread: write the published bf16 state as a Hugging Face model directory."""
        from rlboost.export import export_model

        start = time.monotonic()
        self.path = export_model(
            state, self.model_dir, self.dest(steps_done), stop_ids=self.vocab.stop_ids, pad_id=self.vocab.pad_id
        )
        log.info(
            "export done",
            extra={"export_path": self.path, "steps_done": steps_done, "seconds": round(time.monotonic() - start, 3)},
        )
