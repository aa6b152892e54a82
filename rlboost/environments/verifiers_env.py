"""`verifiers` environments (PyPI `verifiers` 0.4, `import verifiers.v1`) as rlboost harness environments.

    task:
      environment:
        verifiers: my-taskset             # a verifiers environment id: its taskset's id (or `<env id>+<taskset id>`)
        args: {taskset: {num_tasks: 50}}  # merged into the environment's verifiers config (its `[env]` block)

The prompts are the environment's own tasks: rlboost.tasks.verifiers_taskset lists the taskset (the trainer makes
them its task, in the seeded order of every built-in task; each Example carries the task's index), and an env-runner plays each
episode with `VerifiersEnvironment.run`: verifiers runs the task with its harness (the `null` chat harness unless
`args.agent.harness.id` names another), whose model calls reach rlboost's OpenAI-compatible endpoint through
verifiers' own interception and client, every call carrying the episode's key (header X-Rlboost-Episode). The reward
is verifiers' (its rubric over the trace); tool calls are the trace's tool messages.

Run offline: programs run in verifiers' `subprocess` runtime (the env-runner's process is the sandbox), and the chat
harness's program runs with this interpreter, whose packages are the program's (verifiers would otherwise fetch
them with `uv` at each new pod: `_bundled_chat_program`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlboost.environments.harness import Outcome, PolicyEndpoint
from rlboost.tasks.base import Example
from rlboost.tasks.verifiers_taskset import FIELD, KEY, VerifiersError, load

EPISODE_HEADER = "X-Rlboost-Episode"  # env_runner.gateway's: the episode's key
_API_KEY_VAR = "RLBOOST_POLICY_API_KEY"  # what verifiers' client sends as its bearer; the header names the episode


@dataclass
class _Serving:
    stack: contextlib.AsyncExitStack


class VerifiersEnvironment:
    """A harness environment playing `env_id`'s tasks (one episode at a time, its serving resources kept open)."""

    def __init__(self, env_id: str, args: dict[str, Any] | None = None) -> None:
        self.env_id = env_id
        self.env = load(env_id, args or {})
        self.tasks = list(self.env.taskset)
        self._serving: _Serving | None = None
        _bundled_chat_program()
        os.environ.setdefault(_API_KEY_VAR, "rlboost")

    async def run(self, task: Example, policy: PolicyEndpoint) -> Outcome:
        from verifiers.v1.clients import ModelContext
        from verifiers.v1.configs.client import EvalClientConfig

        index = (task.metadata.get(KEY) or {}).get("index")
        if not isinstance(index, int) or not 0 <= index < len(self.tasks):
            raise VerifiersError(f"{FIELD} {self.env_id!r}: the task names no task of it (metadata {task.metadata})")
        await self._serve()
        client = EvalClientConfig(
            base_url=policy.base_url, api_key_var=_API_KEY_VAR, headers={EPISODE_HEADER: policy.api_key}
        )
        ctx = ModelContext(client=client, model=policy.model)
        episode = await self.env.run_slot(self.env.slots(self.tasks[index])[0], ctx)
        return _outcome(episode)

    async def _serve(self) -> None:
        """verifiers' serving resources (its interception server, shared tools), opened with the first episode."""
        if self._serving is None:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(self.env.serving())
            self._serving = _Serving(stack)


def _outcome(episode: Any) -> Outcome:
    errors = [str(getattr(e, "message", e)) for e in getattr(episode, "errors", [])]
    traces = list(episode.traces)
    failed = [t for t in traces if not t.ok]
    if errors or not traces or failed:
        why = errors or [str(getattr(t, "error", "")) for t in failed] or ["no agent ran"]
        raise VerifiersError(f"the verifiers episode failed: {'; '.join(why)[:500]}")
    tools = sum(1 for t in traces for m in t.messages if getattr(m, "role", "") == "tool")
    return Outcome(reward=float(sum(t.reward for t in traces)), tool_calls=tools)


def _bundled_chat_program() -> None:
    """Run verifiers' chat harness program (`null`, PEP 723 script) with this interpreter instead of a `uv`
    environment made for it: its dependencies (openai, mcp, httpx, httpx2, tenacity, certifi) are this process's,
    installed by rlboost[environments], so nothing is downloaded when an env-runner starts (verifiers' subprocess
    runtime keeps prepared scripts in a class-level map: script path -> interpreter)."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
    SubprocessRuntime._interpreters[str(path)] = sys.executable  # noqa: SLF001 - see the docstring
