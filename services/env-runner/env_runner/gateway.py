"""The OpenAI-compatible chat endpoint: an agent harness drives an episode's model turns with chat completions.

    POST /v1/chat/completions   Authorization: Bearer <the episode's key>
    {"messages": [...], "max_tokens": n?, "tools": [...]?}  ->  a chat.completion (choices[0].message, usage,
                                                                 and `rlboost`: the turn's exact token ids, log-probs
                                                                 and weight version)

Each call is one model turn: one `TurnRequest` the rollout-manager schedules, migrates and offloads as any request.
Token in, token out: a call's messages must extend the episode's conversation so far, the assistant replies this
endpoint gave included (compared by content); only the messages after them are rendered with the chat template
(rlboost.environments.chat) and appended, so the model's own turns keep their sampled ids and are never
re-tokenised. A call that does not extend the conversation, or asks for more tokens than the episode has left, is
refused (400, one line naming the field). Sampling is the job's (algorithm.temperature, topP): the request's
sampling fields are ignored. A tool call in the model's text (`<tool_call>{...}</tool_call>`) is returned as
`tool_calls` too; one that does not parse stays text, for the harness to answer as it would any malformed call.

`ChatGateway` is the logic (keys -> episodes, messages -> tokens -> turns); `serve_gateway` puts it on HTTP
(aiohttp) for harnesses that need a URL.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from rlboost.environments.chat import ChatFormat
from rlboost.environments.tools import ToolCall, parse_tool_calls
from rlboost.wire.episode_io import EpisodeAssignment, TurnRequest

from . import metrics
from .episode import Policy
from .transcript import Transcript


class GatewayError(ValueError):
    """A chat completion request that cannot be served; `status` is the HTTP status, the message names the field."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ChatEpisode:
    """One episode as the endpoint sees it: its conversation so far and its transcript."""

    assignment: EpisodeAssignment
    transcript: Transcript = field(default_factory=lambda: Transcript([]))
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation so far, replies included
    stopped: bool = True  # the last turn ended with a stop token
    finished: bool = False  # a turn ran out of the episode's budget: no more turns


class ChatGateway:
    """Chat completions -> model turns of registered episodes."""

    def __init__(self, fmt: ChatFormat, policy: Policy) -> None:
        self.fmt, self.policy = fmt, policy
        self.episodes: dict[str, ChatEpisode] = {}  # key -> episode

    def open(self, a: EpisodeAssignment) -> str:
        """A key for the episode's harness (its bearer token)."""
        key = f"rlb-{secrets.token_urlsafe(18)}"
        self.episodes[key] = ChatEpisode(a)
        return key

    def close(self, key: str) -> ChatEpisode | None:
        return self.episodes.pop(key, None)

    async def complete(self, key: str, body: Any) -> dict[str, Any]:
        ep = self.episodes.get(key)
        if ep is None:
            raise GatewayError(401, "Authorization: no open episode has this key; use the key the episode was given")
        messages = _messages(body)
        new = self._new_messages(ep, messages)
        t, a = ep.transcript, ep.assignment
        if not t.prompt_ids:
            t.prompt_ids = self.fmt.prompt(new)
        else:
            t.add_environment(self.fmt.after_turn(new, ep.stopped))
        budget = min(a.sampling.max_new_tokens, a.max_episode_tokens - len(t), _max_tokens(body))
        if t.turns >= a.max_turns or budget < 1 or ep.finished:
            raise GatewayError(400, "messages: the episode has no turn left (algorithm.maxTurns, maxEpisodeTokens)")
        result = await self.policy(TurnRequest(a.episode_id, a.lease_epoch, t.turns, t.tokens, budget))
        if result.finish_reason == "failed":
            raise GatewayError(503, f"the model turn failed: {result.error}")
        t.add_turn(result)
        ep.stopped = self.fmt.ends_with_stop(result.token_ids)
        text = self.fmt.decode(result.token_ids)
        ep.messages = [*messages, {"role": "assistant", "content": text}]
        return _completion(a, t.turns - 1, text, result, len(t) - len(result.token_ids), ep.stopped)

    def _new_messages(self, ep: ChatEpisode, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        """The messages after the conversation so far; GatewayError when they do not extend it."""
        n = len(ep.messages)
        for i, (had, got) in enumerate(zip(ep.messages, messages[:n], strict=False)):
            if had["role"] != got["role"] or (had.get("content") or "") != (got.get("content") or ""):
                raise GatewayError(400, f"messages[{i}]: differs from the episode's conversation so far")
        new = messages[n:]
        if len(messages) < n or not new:
            raise GatewayError(400, "messages: must extend the episode's conversation with at least one message")
        if any(m["role"] == "assistant" for m in new):
            raise GatewayError(400, "messages: an assistant message this endpoint did not write cannot be added")
        return [{"role": m["role"], "content": m.get("content") or ""} for m in new]


def _messages(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise GatewayError(400, "messages: a non-empty list of {role, content} is required")
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            raise GatewayError(400, f"messages[{i}].role: one of system, user, assistant, tool")
        if not isinstance(m.get("content") or "", str):
            raise GatewayError(400, f"messages[{i}].content: text (content parts are not supported)")
    return body["messages"]


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return 1 << 30
    if not isinstance(value, int) or value < 1:
        raise GatewayError(400, "max_tokens: a positive integer")
    return value


def _tool_calls(text: str) -> list[dict[str, Any]]:
    calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall)]
    return [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for i, c in enumerate(calls)
    ]


def _completion(a: EpisodeAssignment, turn: int, text: str, result, prompt_tokens: int, stopped: bool) -> dict:
    calls = _tool_calls(text)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    reason = "tool_calls" if calls else ("stop" if stopped else "length")
    return {
        "id": f"chatcmpl-{a.episode_id}-t{turn}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "policy",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(result.token_ids),
            "total_tokens": prompt_tokens + len(result.token_ids),
        },
        "rlboost": {
            "episode_id": a.episode_id,
            "turn": turn,
            "token_ids": result.token_ids,
            "logprobs": result.logprobs,
            "weight_version": result.weight_version,
        },
    }


async def serve_gateway(gateway: ChatGateway, host: str, port: int):
    """Serve the endpoint on HTTP (aiohttp); returns (runner, bound port). `await runner.cleanup()` stops it."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        key = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        try:
            body = await request.json()
        except ValueError:
            metrics.GATEWAY_CALLS.labels("refused").inc()
            return _error(web, 400, "body: JSON expected")
        try:
            reply = await gateway.complete(key, body)
        except GatewayError as err:
            metrics.GATEWAY_CALLS.labels("refused" if err.status < 500 else "failed").inc()
            return _error(web, err.status, str(err))
        metrics.GATEWAY_CALLS.labels("ok").inc()
        return web.json_response(reply)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no other way for port 0
    return runner, bound


def _error(web, status: int, message: str):
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
