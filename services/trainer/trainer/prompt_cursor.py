"""Where the trainer's prompts come from and where it stands in them: the prompt stream (rlboost.tasks.dataset),
its cursor (epoch and position, checkpointed), the look-ahead batch that says whether a step is the data's last,
and the chat template that turns a prompt's messages into token ids.

Rank 0 only. The stream is opened before the first step (a bad dataset fails there, with a clear error) and read
off the event loop (`asyncio.to_thread`): reading and templating take time.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlboost.spec import JobSpec
from rlboost.tasks.base import Cursor, PromptBatch
from rlboost.tasks.dataset import DatasetError
from trainer import metrics
from trainer.vocabulary import Vocabulary

log = logging.getLogger(__name__)


class PromptCursor:
    """The prompt stream, the cursor into it, and the next step's batch once it was read."""

    def __init__(self, spec: JobSpec, vocab: Vocabulary, run_dir: Path) -> None:
        self.spec, self.vocab, self.run_dir = spec, vocab, run_dir
        self.stream: Any = None  # rlboost.tasks.dataset.make_prompts' stream, set by open()
        self.cursor = Cursor()  # where the next step's prompts start (checkpointed)
        self.encode: Any = None  # chat messages -> prompt ids (the chat template), set by open()
        self._next_batch: PromptBatch | None = None  # the following step's prompts (known: is this step the last?)

    def open(self) -> None:
        """Before the first step: the prompt stream, checked (columns, rows, a first batch that fits
        task.dataset.maxPromptTokens), and the chat template recorded in the run directory and the log."""
        from rlboost.models.tokenizer import chat_template_record, encode_prompt
        from rlboost.tasks.dataset import check_dataset, make_prompts

        data = self.spec.task.active_dataset
        thinking, system = (data.thinking, data.system_prompt) if data else (None, "")
        tokenizer = self.vocab.tokenizer
        if data is not None and not isinstance(tokenizer.chat_template, str):
            raise DatasetError(
                "task.dataset: the model's tokenizer has no chat template (tokenizer_config.json chat_template); "
                "use a chat model or add a template to its tokenizer"
            )

        def encode(messages: list[dict[str, str]]) -> list[int]:
            return encode_prompt(tokenizer, messages, enable_thinking=thinking)

        self.encode = encode  # evaluation encodes the validation prompts the same way
        prompts = make_prompts(self.spec.task, encode)
        try:
            check_dataset(self.spec.task, self.spec.algorithm.prompts_per_step, encode, train=prompts if data else None)
        except BaseException:
            prompts.close()
            raise
        record = chat_template_record(tokenizer, thinking, system)
        (self.run_dir / "chat_template.json").write_text(json.dumps(record, indent=1) + "\n")
        log.info("chat template", extra={k: v for k, v in record.items() if k != "template"})
        if thinking is not None and not record["reads_enable_thinking"]:
            log.warning("task.dataset.enableThinking is set but the chat template does not read enable_thinking")
        self.stream = prompts

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    def encode_example(self, example: Any) -> list[int]:
        """An example's prompt ids, through the task's messages and the chat template (the built-in task)."""
        return self.encode(self.stream.task.messages(example))

    # ---- whole steps ----

    def take_step(self, step: int) -> PromptBatch | None:
        """The step's promptsPerStep prompts, the cursor moved past them; None: the last epoch ended (a partial
        batch is dropped). Prompts skipped for length are counted and logged."""
        batch = self._take()
        if len(batch.examples) < self.spec.algorithm.prompts_per_step:
            return None
        self.cursor = batch.cursor
        if batch.skipped:
            metrics.PROMPTS_SKIPPED.inc(batch.skipped)
            log.warning(
                "prompts longer than task.dataset.maxPromptTokens skipped",
                extra={"step": step, "skipped": batch.skipped, "skipped_total": self.stream.skipped_total},
            )
        return batch

    def data_ends(self) -> bool:
        """The batch after the last one taken cannot fill a step: the step just taken is the data's last."""
        return self._next_batch is not None and len(self._next_batch.examples) < self.spec.algorithm.prompts_per_step

    def _take(self) -> PromptBatch:
        """The step's prompts from the cursor; the following step's are taken too (to know whether this is the
        last step of the data), so each batch is read once."""
        n = self.spec.algorithm.prompts_per_step
        batch = self._next_batch if self._next_batch is not None else self.stream.take(self.cursor, n)
        self._next_batch = self.stream.take(batch.cursor, n) if len(batch.examples) == n else None
        return batch

    # ---- partial rollout: any number of new prompts ----

    def peek(self, n: int) -> PromptBatch:
        """The next `n` prompts, the cursor left where it is (see `advance`)."""
        return self.stream.take(self.cursor, n)

    def advance(self, batch: PromptBatch) -> None:
        """Move the cursor past a peeked batch (its skipped prompts counted)."""
        metrics.PROMPTS_SKIPPED.inc(batch.skipped)
        self.cursor = batch.cursor

    # ---- checkpoints ----

    def checkpoint(self) -> dict[str, int]:
        """The cursor, as the checkpoint's TrainerState.data_cursor."""
        return asdict(self.cursor)

    def dataset_rows(self) -> int:
        """Rows of task.dataset.train (0: the built-in task); a checkpoint resumes only on as many."""
        return self.stream.num_rows if self.spec.task.active_dataset is not None else 0

    def resume_at(self, saved: dict[str, int] | None, steps_done: int) -> None:
        """The checkpoint's cursor; a checkpoint written before cursors: the built-in task's order is a function
        of the step."""
        if saved is not None:
            self.cursor = Cursor(**saved)
        else:
            self.cursor = Cursor(*divmod(steps_done * self.spec.algorithm.prompts_per_step, self.stream.num_rows))

    @property
    def epoch(self) -> int:
        return self.cursor.epoch
