"""One episode, driven: the environment's first messages, then model turn after model turn (each asked of the
rollout-manager with the episode's tokens so far) and environment step after step, until the environment says the
episode is done, `max_turns` turns were taken or the next turn would not fit `max_episode_tokens`.

Every model turn goes through the chat endpoint's bookkeeping (env_runner.gateway.ChatGateway): a reset/step
environment's conversation is sent to it in-process (`EpisodeRun`), a harness environment calls it over HTTP from its
confined process (`HarnessRun`); either way the episode's tokens are the endpoint's transcript.

The environment runs in its confined process (rlboost.environments.sandbox); every call is bounded by
task.environment.stepTimeoutSeconds. A call that fails (crash, timeout, refused, a reply that is none) ends the
episode with finish reason 'failed' and the reason in its stats; the manager then follows rollout.onFailedRequest.
A malformed tool call is the environment's to answer (an observation), never a failure of the episode.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, fields

from rlboost.environments.chat import TemplateError
from rlboost.environments.harness import UNIX_BASE_URL
from rlboost.environments.sandbox import EnvFailure, EnvProcess, StepReply
from rlboost.tasks.base import Example
from rlboost.wire.episode_io import EpisodeAssignment, EpisodeResult
from rlboost.wire.rollout_io import EpisodeStats

from . import metrics
from .gateway import ChatEpisode, ChatGateway, GatewayError
from .transcript import Transcript

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


class _Run:
    """What both kinds of episode share: the endpoint's key, failures made an end, the result from the transcript."""

    def __init__(self, a: EpisodeAssignment, env: EnvProcess, gateway: ChatGateway) -> None:
        self.a, self.env, self.gateway = a, env, gateway
        self.stats = EpisodeStats()
        self.key = ""
        self.chat: ChatEpisode | None = None

    async def run(self) -> EpisodeResult:
        self.key = self.gateway.open(self.a)
        self.chat = self.gateway.episodes[self.key]
        try:
            end = await self._drive()
        except EnvFailure as err:
            metrics.ENV_FAILURES.labels(err.reason).inc()
            end = EpisodeEnd("failed", env_error=f"{err.reason}: {err.detail}")
        except (TemplateError, ValueError) as err:
            end = EpisodeEnd("failed", env_error=f"bad_task: {err}")
        finally:
            self.gateway.close(self.key)
        if self.chat.error:  # a model turn failed: the harness may have gone on, the episode cannot
            end = EpisodeEnd("failed", env_error=self.chat.error)
        metrics.EPISODES.labels(end.finish_reason).inc()
        metrics.TURNS_PER_EPISODE.observe(self.chat.transcript.turns)
        self.stats.env_error = end.env_error
        return self._result(end)

    async def _drive(self) -> EpisodeEnd:
        raise NotImplementedError

    def _count_tools(self, calls: int, failures: int) -> None:
        self.stats.tool_calls += calls
        self.stats.tool_failures += failures
        if calls:
            metrics.TOOL_CALLS.inc(calls)
        if failures:
            metrics.TOOL_FAILURES.inc(failures)

    def _result(self, end: EpisodeEnd) -> EpisodeResult:
        assert self.chat is not None
        t: Transcript = self.chat.transcript
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


class EpisodeRun(_Run):
    """A reset/step environment's episode: its conversation sent to the endpoint turn by turn, in-process."""

    async def _drive(self) -> EpisodeEnd:
        assert self.chat is not None
        conversation = await self._timed(self.env.reset(task_of(self.a.task_json)))
        for _ in range(self.a.max_turns):
            try:
                reply = await self.gateway.complete(self.key, {"messages": conversation})
            except GatewayError:
                if self.chat.error:
                    return EpisodeEnd("failed", env_error=self.chat.error)
                if self.chat.exhausted:
                    return EpisodeEnd("length")
                raise
            text = reply["choices"][0]["message"]["content"]
            step = await self._step(text)
            if step.done:
                return EpisodeEnd("stop", reward=step.reward)
            conversation += [{"role": "assistant", "content": text}, *step.observation]
        return EpisodeEnd("length")

    async def _step(self, action: str) -> StepReply:
        step: StepReply = await self._timed(self.env.step(action))
        self._count_tools(step.tool_calls, step.tool_failures)
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


class HarnessRun(_Run):
    """A harness environment's episode: its `run` calls the endpoint over the env-runner's Unix socket; the time it
    spends between model turns is its tool time, bounded by task.environment.stepTimeoutSeconds at a stretch."""

    async def _drive(self) -> EpisodeEnd:
        assert self.chat is not None
        chat = self.chat
        tcp = self.gateway.tcp_url if self.env.config.verifiers else ""
        policy = {
            "base_url": tcp or UNIX_BASE_URL,
            "api_key": self.key,
            "episode_id": self.a.episode_id,
            "socket_path": "" if tcp else self.gateway.socket_path,
        }
        start = time.monotonic()
        try:
            reply = await self.env.run(task_of(self.a.task_json), policy, chat.idle_seconds)
        finally:
            self.stats.tool_seconds += max(0.0, time.monotonic() - start - chat.turn_seconds)
            metrics.TOOL_SECONDS.observe(self.stats.tool_seconds)
        self._count_tools(reply.tool_calls, reply.tool_failures)
        if chat.transcript.turns == 0:
            return EpisodeEnd("failed", env_error="bad_reply: the harness asked for no model turn")
        return EpisodeEnd("length" if chat.exhausted else "stop", reward=reply.reward)
