"""The OpenAI-compatible chat endpoint: an agent harness drives an episode's model turns with chat completions.

    POST /v1/chat/completions   Authorization: Bearer <the episode's key>   (or X-Rlboost-Episode: <key>)
    {"messages": [...], "max_tokens": n?, "tools": [...]?}  ->  a chat.completion (choices[0].message, usage,
                                                                 and `rlboost`: the episode id, the turn's exact token
                                                                 ids, log-probs and weight version)

An episode's key is `<episode id>.<secret>`: it names the episode (`s<step>-p<prompt>-g<sample>`, the id the trainer
and the manager know it by) and proves the caller was handed it. The env-runner opens a key per episode it drives
(`open`), gives it to the episode's harness, and closes it when the harness is done (`close`: the transcript).
Both the env-runner's own reset/step environments (in-process, `complete`) and harnesses over HTTP go through here.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rlboost.environments.chat import ChatFormat
from rlboost.environments.tools import ToolCall, parse_tool_calls
from rlboost.wire.episode_io import EpisodeAssignment, TurnRequest, TurnResult

from . import metrics
from .transcript import Transcript

Policy = Callable[[TurnRequest], Awaitable[TurnResult]]  # one model turn, through the rollout-manager


EPISODE_HEADER = "X-Rlboost-Episode"  # the episode's key, for clients whose API key is fixed


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
    exhausted: bool = False  # a call was refused for the episode's budget (algorithm.maxTurns, maxEpisodeTokens)
    error: str = ""  # a model turn that failed (the harness was answered 503): the episode fails with it
    in_turn: bool = False  # a call is being served (its model turn generating)
    turn_seconds: float = 0.0  # wall time of its calls (the rest of a harness's time is its own: tools)
    last_active: float = field(default_factory=time.monotonic)  # when the last call was answered (or the opening)

    def idle_seconds(self) -> float:
        """How long the harness has gone without a model turn in flight (0 while one is): its own (tool) time."""
        return 0.0 if self.in_turn else time.monotonic() - self.last_active


class ChatGateway:
    """Chat completions -> model turns of registered episodes."""

    def __init__(self, fmt: ChatFormat, policy: Policy, socket_path: str = "") -> None:
        self.fmt, self.policy = fmt, policy
        self.socket_path = socket_path  # where serve_gateway serves it for confined harnesses ('' = not served)
        self.tcp_url = ""  # its loopback URL when served on TCP too (verifiers environments)
        self.episodes: dict[str, ChatEpisode] = {}  # key -> episode

    def open(self, a: EpisodeAssignment) -> str:
        """A key for the episode's harness (its bearer token): `<episode id>.<secret>`."""
        key = f"{a.episode_id}.{secrets.token_urlsafe(18)}"
        self.episodes[key] = ChatEpisode(a)
        return key

    def close(self, key: str) -> ChatEpisode | None:
        return self.episodes.pop(key, None)

    async def complete(self, key: str, body: Any) -> dict[str, Any]:
        """One model turn of the episode `key` names; GatewayError (nothing recorded) when it cannot be served."""
        ep = self.episodes.get(key)
        if ep is None:
            raise GatewayError(401, "Authorization: no open episode has this key; use the key the episode was given")
        if ep.in_turn:
            raise GatewayError(409, "messages: the episode's previous call is still being answered (one at a time)")
        ep.in_turn, start = True, time.monotonic()
        try:
            return await self._turn(ep, body)
        finally:
            ep.in_turn, ep.last_active = False, time.monotonic()
            ep.turn_seconds += ep.last_active - start

    async def _turn(self, ep: ChatEpisode, body: Any) -> dict[str, Any]:
        messages = _messages(body)
        new = self._new_messages(ep, messages)
        t, a = ep.transcript, ep.assignment
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        following = self.fmt.prompt(new, tools) if not t.prompt_ids else self.fmt.after_turn(new, ep.stopped)
        start = len(t) if t.prompt_ids else 0
        budget = min(a.sampling.max_new_tokens, a.max_episode_tokens - start - len(following), _max_tokens(body))
        if t.turns >= a.max_turns or budget < 1:
            ep.exhausted = True
            raise GatewayError(400, "messages: the episode has no turn left (algorithm.maxTurns, maxEpisodeTokens)")
        if not t.prompt_ids:
            t.prompt_ids = following
        else:
            t.add_environment(following)  # recorded only once the turn is sure to be asked for
        result = await self.policy(TurnRequest(a.episode_id, a.lease_epoch, t.turns, t.tokens, budget))
        if result.finish_reason == "failed":
            ep.error = f"turn {t.turns}: {result.error or 'failed'}"
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
        if len(messages) < n or not (new or ep.transcript.turns):  # none new after a reply: the model goes on
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


async def serve_gateway(gateway: ChatGateway, host: str = "127.0.0.1", port: int = 0, path: str = ""):
    """Serve the endpoint on HTTP (aiohttp) at host:port, or on the Unix socket `path` (what a confined harness,
    without a network of its own, reaches); returns (runner, bound port or 0). `await runner.cleanup()` stops it."""
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        key = request.headers.get(EPISODE_HEADER) or request.headers.get("Authorization", "").removeprefix("Bearer ")
        key = key.strip()
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
        if isinstance(body, dict) and body.get("stream"):
            return await _stream(web, request, reply, bool((body.get("stream_options") or {}).get("include_usage")))
        return web.json_response(reply)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "policy", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if path:
        await web.UnixSite(runner, path).start()
        return runner, 0
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - aiohttp exposes no other way for port 0
    return runner, bound


async def _stream(web, request, reply: dict[str, Any], usage: bool):
    """A finished completion as the server-sent events of a streamed one (the turn is generated whole first: a
    turn is one request to the manager, so the harness gets its tokens at once, in one delta)."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in stream_chunks(reply, usage):
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def stream_chunks(reply: dict[str, Any], usage: bool) -> list[dict[str, Any]]:
    """`reply` (a chat.completion) as chat.completion.chunk objects: the message, the finish reason, the usage."""
    head = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = reply["choices"][0]
    delta = dict(choice["message"])
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    chunks = [
        {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
         "rlboost": reply["rlboost"]},
    ]  # fmt: skip
    if usage:
        chunks.append({**head, "choices": [], "usage": reply["usage"]})
    return chunks


def _error(web, status: int, message: str):
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)
