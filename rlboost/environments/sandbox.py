"""Environments run confined: each episode's environment in a process of its own (rlboost.environments.sandbox_child),
spoken to in JSON lines from asyncio, every call bounded in time.

    pool = EnvPool(EnvConfig.from_spec(spec.task.environment))
    proc = await pool.acquire()                  # an idle process, or a fresh one (EnvFailure("load") if it cannot)
    messages = await proc.reset(task)            # the episode's first messages
    reply = await proc.step(action)              # StepReply: observation, reward, done, tool counts
    pool.release(proc)                           # back to the idle ones (a failed one is gone already)

A call past `step_timeout_s` kills the process (EnvFailure "timeout"); one that crashes it, exceeds its CPU or
memory, is refused by the audit hook or answers something that is no reply raises EnvFailure with that reason.
Nothing the process writes is executed here: replies are JSON. Torch-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from dataclasses import asdict, dataclass
from typing import Any

from rlboost.environments.base import EnvironmentReplyError, Message, messages_from
from rlboost.tasks.base import Example

FAILURE_REASONS = ("load", "timeout", "crash", "cpu", "memory", "refused", "bad_reply")
START_TIMEOUT_S = 120.0  # importing the environment's package may be slow on a busy machine
_MAX_REPLY_BYTES = 16 << 20  # a reply is messages; beyond this the protocol is broken


class EnvFailure(Exception):  # noqa: N818 (an outcome the caller reports, not a bug)
    """The environment failed a call; `reason` is one of FAILURE_REASONS, `detail` one line."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, and what one call may use (the job spec's task.environment)."""

    name: str
    args: dict[str, Any]
    step_timeout_s: float = 30.0
    cpu_seconds: int = 60
    memory_mib: int = 2048

    @classmethod
    def from_spec(cls, env: Any) -> EnvConfig:
        return cls(env.name, dict(env.args), env.step_timeout_seconds, env.cpu_seconds, env.memory_mib)


@dataclass
class StepReply:
    observation: list[Message]
    reward: float | None
    done: bool
    tool_calls: int = 0
    tool_failures: int = 0


class EnvProcess:
    """One confined environment process serving one episode at a time."""

    def __init__(self, proc: asyncio.subprocess.Process, config: EnvConfig) -> None:
        self.proc, self.config = proc, config
        self.netns = False
        self.alive = True
        self.busy = False  # a call was sent and its reply not read (the caller was cancelled meanwhile)

    @classmethod
    async def start(cls, config: EnvConfig) -> EnvProcess:
        child = {"name": config.name, "args": config.args, "memory_mib": config.memory_mib}
        child["cpu_seconds"] = config.cpu_seconds
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rlboost.environments.sandbox_child",
            json.dumps(child),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=_MAX_REPLY_BYTES,
        )
        self = cls(proc, config)
        reply = await self._reply(START_TIMEOUT_S)
        if not reply.get("ready"):
            await self.kill()
            raise EnvFailure("load", f"task.environment.name {config.name!r}: {reply.get('detail', reply)}")
        self.netns = bool(reply.get("netns"))
        return self

    async def reset(self, task: Example) -> list[Message]:
        reply = await self.call({"op": "reset", "task": asdict(task)})
        try:
            return messages_from(reply.get("messages"), "reset()")
        except EnvironmentReplyError as err:
            await self.kill()
            raise EnvFailure("bad_reply", str(err)) from None

    async def step(self, action: str) -> StepReply:
        reply = await self.call({"op": "step", "action": action})
        try:
            return StepReply(
                messages_from(reply["observation"], "step()"),
                reply["reward"],
                bool(reply["done"]),
                int(reply.get("tool_calls", 0)),
                int(reply.get("tool_failures", 0)),
            )
        except (KeyError, TypeError, ValueError) as err:
            await self.kill()
            raise EnvFailure("bad_reply", f"step(): {err}") from None

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply within the step timeout; EnvFailure (the process is gone) otherwise."""
        if not self.alive:
            raise EnvFailure("crash", "the environment's process already ended")
        assert self.proc.stdin is not None
        self.busy = True
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: the reply's EOF says how
        reply = await self._reply(self.config.step_timeout_s)
        self.busy = False
        if "fail" in reply:
            await self.kill()
            raise EnvFailure(str(reply["fail"]), str(reply.get("detail", ""))[:500])
        return reply

    async def _reply(self, timeout: float) -> dict[str, Any]:
        """The next reply line; EnvFailure (after killing the process) on a timeout, EOF or a broken line."""
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            await self.kill()
            raise EnvFailure("timeout", f"no reply within {timeout:g}s (task.environment.stepTimeoutSeconds)") from None
        except ValueError:  # longer than the stream's limit
            await self.kill()
            raise EnvFailure("bad_reply", f"a reply over {_MAX_REPLY_BYTES} bytes") from None
        if not line:
            code = await self.kill()
            reason = "cpu" if code == -signal.SIGXCPU else "crash"
            raise EnvFailure(reason, f"the environment's process exited with {code}")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            await self.kill()
            raise EnvFailure("bad_reply", f"not a reply: {line[:200]!r}")
        return reply

    async def kill(self) -> int:
        """End the process (if still running) and close its pipes; how it ended (negative: by that signal)."""
        self.alive = False
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        code = await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        transport = getattr(self.proc, "_transport", None)  # asyncio keeps it open until closed
        if transport is not None:
            transport.close()
        return code


class EnvPool:
    """Idle environment processes, reused episode after episode; a failed one is replaced by a fresh start."""

    def __init__(self, config: EnvConfig, concurrent_starts: int = 2) -> None:
        self.config = config
        self._idle: list[EnvProcess] = []
        self.started = 0  # processes started, since the pool's start
        # a start is an interpreter importing the environment: a burst of them (a step's first episodes) would take
        # every core at once and starve the caller's event loop (its heartbeats), so a few at a time
        self._starting = asyncio.Semaphore(concurrent_starts)
        self._ending: set[asyncio.Task] = set()  # kills of processes released mid-call

    async def acquire(self) -> EnvProcess:
        while self._idle:
            proc = self._idle.pop()
            if proc.alive and proc.proc.returncode is None:
                return proc
        async with self._starting:
            if self._idle:  # one was released while this waited
                return await self.acquire()
            self.started += 1
            return await EnvProcess.start(self.config)

    def release(self, proc: EnvProcess) -> None:
        """Back to the idle ones; a process with a call in flight (its episode was cancelled) is ended instead."""
        if proc.busy and proc.alive:
            task = asyncio.ensure_future(proc.kill())
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)
            proc.alive = False
        elif proc.alive and proc.proc.returncode is None:
            self._idle.append(proc)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for proc in idle:
            await proc.kill()
        if self._ending:
            await asyncio.gather(*self._ending)
