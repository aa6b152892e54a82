"""Evaluation (`spec.evaluation`), rank 0: after every K-th step (and the last), once its weights are published, the
validation prompts (rlboost.tasks.validation) are rolled out at that version, k samples each, judged in the reward
sandbox and summarised (rlboost.evaluation: mean reward, pass@1, pass@k, response length) into the step's report.

The validation set is taken and encoded once, at the first evaluation. An evaluation is bounded by
rollout.stepDeadlineS like a step's rollout; past it the step is reported without one (a slow evaluation does not
fail the training).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from rlboost.evaluation import ScoredResponse, summarize
from rlboost.spec import JobSpec
from rlboost.tasks.base import Cursor
from rlboost.tasks.validation import validation_source
from rlboost.wire.events import ValidationReport
from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams
from trainer.assembly import with_prompts
from trainer.judge import Judge
from trainer.prompt_cursor import PromptCursor
from trainer.rollout_client import RolloutClient
from trainer.vocabulary import Vocabulary

log = logging.getLogger(__name__)


class Evaluator:
    """Rolls the validation prompts out at a step's published weights and summarises how they score."""

    def __init__(self, spec: JobSpec, steps: int, prompts: PromptCursor, judge: Judge, vocab: Vocabulary) -> None:
        self.spec, self.steps, self.prompts, self.judge, self.vocab = spec, steps, prompts, judge, vocab
        self._validation: tuple[list[Any], list[PromptItem]] | None = None  # encoded once, at the first evaluation

    def due(self, step: int) -> bool:
        every = self.spec.evaluation.every_steps
        return every > 0 and ((step + 1) % every == 0 or step + 1 == self.steps)

    async def run(self, step: int, rc: RolloutClient, version: int) -> ValidationReport | None:
        """The evaluation at `version`, or None (logged) when rollout.stepDeadlineS passed first."""
        deadline = self.spec.rollout.step_deadline_s
        try:
            async with asyncio.timeout(deadline or None):
                return await self._evaluate(step, rc, version)
        except TimeoutError:
            log.warning(
                "evaluation skipped: rollout.stepDeadlineS passed", extra={"step": step, "deadline_s": deadline}
            )
            return None

    async def _evaluate(self, step: int, rc: RolloutClient, version: int) -> ValidationReport:
        """Roll the validation prompts out at the step's published weights, score them, summarise."""
        ev, start = self.spec.evaluation, time.monotonic()
        request, examples = self.request(step, version)
        trajs = [t async for t in rc.rollout(request)]
        results = await self.judge.judge(step, examples, trajs, budget=("validation", step))
        groups: list[list[ScoredResponse]] = [[] for _ in examples]
        for traj, result in zip(trajs, results, strict=True):
            groups[traj.prompt_index].append(
                ScoredResponse(result.value, len(traj.response_ids), result.failure is not None)
            )
        report = summarize(step, version, groups, ev.samples, ev.pass_threshold, time.monotonic() - start)
        log.info(
            "validation done",
            extra={
                "step": step,
                "reward_mean": round(report.reward_mean, 4),
                "pass_at_1": round(report.pass_at_1, 4),
                f"pass_at_{ev.samples}": round(report.pass_at_k, 4),
                "seconds": round(report.seconds, 3),
            },
        )
        return report

    def request(self, step: int, version: int) -> tuple[RolloutRequest, list[Any]]:
        """The validation prompts at `version`, k samples each, with the evaluation's sampling. Its step id is
        -(step + 1): the manager keeps it apart from training steps, and no trajectory is trained on."""
        ev = self.spec.evaluation
        if self._validation is None:
            examples, ids = self._validation_set(ev.prompts)
            self._validation = (examples, [PromptItem(i, p) for i, p in enumerate(ids)])
        examples, prompts = self._validation
        sampling = SamplingParams(
            temperature=ev.temperature,
            top_p=ev.top_p,
            top_k=0,
            max_new_tokens=ev.max_new_tokens or self.spec.algorithm.max_new_tokens,
            seed=ev.seed,
            stop_token_ids=self.vocab.stop_ids,
        )
        request = RolloutRequest(-(step + 1), version, prompts, ev.samples, sampling, vocab_size=self.vocab.size)
        with_prompts(request, self.spec, examples, [p.token_ids for p in prompts])  # episodes: the tasks
        return request, examples

    def _validation_set(self, limit: int) -> tuple[list[Any], list[list[int]]]:
        """The first `limit` validation prompts and their ids: task.dataset.validation (in file order, too-long
        prompts skipped as in training) where the job has one, else the built-in task's held-out set."""
        data = self.spec.task.active_dataset
        if data is not None and data.validation:
            from rlboost.tasks.dataset import DatasetPrompts

            split = DatasetPrompts(self.spec.task, self.prompts.encode, split="validation")
            try:
                batch = split.take(Cursor(), limit)
            finally:
                split.close()
            return batch.examples, batch.prompt_ids
        examples = validation_source(self.spec).validation_examples(limit)
        return examples, [self.prompts.encode_example(e) for e in examples]
