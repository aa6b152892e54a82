"""Harness environments: the user's own agent loop drives an episode through the OpenAI-compatible policy endpoint.

    class Solver:                                    # registered like any environment: rlboost.environments entry point
        def __init__(self, **args): ...
        def run(self, task: Example, policy: PolicyEndpoint) -> Outcome | float | None:   # or `async def run`
            client = policy.openai()                 # an openai.OpenAI on the episode's endpoint
            reply = client.chat.completions.create(model=policy.model, messages=[...])
            ...                                      # tools, more turns: every call is one model turn
            return Outcome(reward=1.0, tool_calls=2)

An environment object with `run` (and no `step`) is a harness: the env-runner opens the episode on its chat endpoint
(env_runner.gateway), hands `run` the task and a `PolicyEndpoint` (the endpoint's URL and the episode's key), and
takes the episode's tokens from the endpoint's bookkeeping when `run` returns: the model's turns exactly as sampled,
the messages the harness added in between rendered by the chat template (masked out of the loss). The harness runs
confined like every environment (no network of its own): it reaches the endpoint over the env-runner's Unix socket,
which `openai()` / `http_client()` are set up for. A harness may use any HTTP client that can speak over a Unix
socket (httpx: `transport=httpx.HTTPTransport(uds=policy.socket_path)`).

Torch-free; openai and httpx are imported when asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

UNIX_BASE_URL = "http://rlboost-policy/v1"  # the host part is ignored over a Unix socket


@dataclass(frozen=True)
class PolicyEndpoint:
    """Where a harness asks for the episode's model turns: an OpenAI-compatible base URL and the episode's key."""

    base_url: str  # e.g. http://127.0.0.1:8911/v1, or UNIX_BASE_URL with `socket_path`
    api_key: str  # the episode's key: `<episode id>.<secret>` (Authorization: Bearer, or X-Rlboost-Episode)
    episode_id: str  # s<step>-p<prompt>-g<sample>
    socket_path: str = ""  # the endpoint's Unix socket ('' = base_url is reached over TCP)
    model: str = "policy"  # the model name the endpoint answers to (any name is accepted)

    def http_client(self) -> Any:
        """An httpx.Client that reaches the endpoint (over its Unix socket when it has one)."""
        import httpx

        transport = httpx.HTTPTransport(uds=self.socket_path) if self.socket_path else None
        return httpx.Client(transport=transport, timeout=None)

    def async_http_client(self) -> Any:
        import httpx

        transport = httpx.AsyncHTTPTransport(uds=self.socket_path) if self.socket_path else None
        return httpx.AsyncClient(transport=transport, timeout=None)

    def openai(self) -> Any:
        """An openai.OpenAI client on the episode's endpoint (retries off: a turn is asked for once)."""
        import openai

        return openai.OpenAI(
            base_url=self.base_url, api_key=self.api_key, http_client=self.http_client(), max_retries=0
        )

    def async_openai(self) -> Any:
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, http_client=self.async_http_client(), max_retries=0
        )


@dataclass
class Outcome:
    """What a harness's `run` returns (or just the reward, or None: task.reward judges the episode's text)."""

    reward: float | None = None
    tool_calls: int = 0
    tool_failures: int = 0


def outcome_from(value: Any) -> Outcome:
    """`run`'s return value made an Outcome; ValueError saying what is wrong otherwise."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        value = Outcome(None if value is None else float(value))
    if not isinstance(value, Outcome):
        raise ValueError(f"run() returned {type(value).__name__}; return an Outcome, a reward (a number) or None")
    if value.reward is not None and (
        isinstance(value.reward, bool) or not isinstance(value.reward, int | float) or not math.isfinite(value.reward)
    ):
        raise ValueError(f"run() reward {value.reward!r} is not a finite number")
    return value


def is_harness(env: Any) -> bool:
    """A harness environment (`run`) rather than a reset/step one."""
    return callable(getattr(env, "run", None)) and not callable(getattr(env, "step", None))
