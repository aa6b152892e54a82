"""One episode, driven: the environment's first messages, then model turn after model turn (each asked of the
rollout-manager with the episode's tokens so far) and environment step after step, until the environment says the
episode is done, `max_turns` turns were taken or the next turn would not fit `max_episode_tokens`.

The environment runs in its confined process (rlboost.environments.sandbox); every call is bounded by
task.environment.stepTimeoutSeconds. A call that fails (crash, timeout, refused, a reply that is none) ends the
episode with finish reason 'failed' and the reason in its stats; the manager then follows rollout.onFailedRequest.
A malformed tool call is the environment's to answer (an observation), never a failure of the episode.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

from rlboost.environments.chat import ChatFormat, TemplateError
from rlboost.environments.sandbox import EnvFailure, EnvProcess, StepReply
from rlboost.tasks.base import Example
from rlboost.wire.episode_io import EpisodeAssignment, EpisodeResult, TurnRequest, TurnResult
from rlboost.wire.rollout_io import EpisodeStats

from . import metrics
from .transcript import Transcript

Policy = Callable[[TurnRequest], Awaitable[TurnResult]]  # one model turn, through the rollout-manager
_EXAMPLE_FIELDS = {f.name for f in fields(Example)}


def task_of(task_json: str) -> Example:
    """The environment's task from the manager's JSON (unknown keys ignored; a bare string is the question)."""
    value = json.loads(task_json) if task_json else {}
    if isinstance(value, str):
        return Example(value, "")
    if not isinstance(value, dict):
        raise ValueError("task_json: expected an object with question, answer, messages, metadata")
    known = {k: v for k, v in value.items() if k in _EXAMPLE_FIELDS}
    known.setdefault("question", "")
    known.setdefault("answer", "")
    known["answer"] = str(known["answer"])
    return Example(**known)


@dataclass
class EpisodeEnd:
    finish_reason: str  # "stop" | "length" | "failed"
    reward: float | None = None
    env_error: str = ""


class EpisodeRun:
    """Drives one assigned episode against one environment process."""

    def __init__(self, a: EpisodeAssignment, env: EnvProcess, fmt: ChatFormat, policy: Policy) -> None:
        self.a, self.env, self.fmt, self.policy = a, env, fmt, policy
        self.stats = EpisodeStats()
        self.transcript = Transcript([])

    async def run(self) -> EpisodeResult:
        try:
            end = await self._drive()
        except EnvFailure as err:
            metrics.ENV_FAILURES.labels(err.reason).inc()
            end = EpisodeEnd("failed", env_error=f"{err.reason}: {err.detail}")
        except (TemplateError, ValueError) as err:
            end = EpisodeEnd("failed", env_error=f"bad_task: {err}")
        metrics.EPISODES.labels(end.finish_reason).inc()
        metrics.TURNS_PER_EPISODE.observe(self.transcript.turns)
        self.stats.env_error = end.env_error
        return self._result(end)

    async def _drive(self) -> EpisodeEnd:
        a, t = self.a, self.transcript
        messages = await self._timed(self.env.reset(task_of(a.task_json)))
        t.prompt_ids = self.fmt.prompt(messages)
        for turn in range(a.max_turns):
            budget = min(a.sampling.max_new_tokens, a.max_episode_tokens - len(t))
            if budget < 1:
                return EpisodeEnd("length")
            result = await self.policy(TurnRequest(a.episode_id, a.lease_epoch, turn, t.tokens, budget))
            if result.finish_reason == "failed":
                return EpisodeEnd("failed", env_error=f"turn {turn}: {result.error or 'failed'}")
            t.add_turn(result)
            step = await self._step(self.fmt.decode(result.token_ids))
            if step.done:
                return EpisodeEnd("stop", reward=step.reward)
            if turn + 1 == a.max_turns:
                break
            following = self.fmt.after_turn(step.observation, self.fmt.ends_with_stop(result.token_ids))
            if len(t) + len(following) >= a.max_episode_tokens:  # no room left for a model token after it
                return EpisodeEnd("length")
            t.add_environment(following)
        return EpisodeEnd("length")

    async def _step(self, action: str) -> StepReply:
        step: StepReply = await self._timed(self.env.step(action))
        self.stats.tool_calls += step.tool_calls
        self.stats.tool_failures += step.tool_failures
        if step.tool_calls:
            metrics.TOOL_CALLS.inc(step.tool_calls)
        if step.tool_failures:
            metrics.TOOL_FAILURES.inc(step.tool_failures)
        return step

    async def _timed(self, call: Awaitable):
        """An environment call, its wall time counted as the episode's tool time."""
        start = time.monotonic()
        try:
            return await call
        finally:
            elapsed = time.monotonic() - start
            self.stats.tool_seconds += elapsed
            metrics.TOOL_SECONDS.observe(elapsed)

    def _result(self, end: EpisodeEnd) -> EpisodeResult:
        t = self.transcript
        return EpisodeResult(
            episode_id=self.a.episode_id,
            lease_epoch=self.a.lease_epoch,
            prompt_ids=t.prompt_ids,
            response_ids=t.ids,
            logprobs=t.logprobs,
            loss_mask=bytes(t.mask),
            finish_reason=end.finish_reason,
            turns=t.turns,
            version_spans=t.version_spans(),
            reward=end.reward,
            stats=self.stats,
            workers=t.workers,
        )
