"""Environments run confined: each episode's environment in a process of its own (rlboost.environments.sandbox_child),
spoken to in JSON lines from asyncio, every call bounded in time.

    pool = EnvPool(EnvConfig.from_spec(spec.task.environment))
    proc = await pool.acquire()                  # an idle process, or a fresh one (EnvFailure("load") if it cannot)
    messages = await proc.reset(task)            # the episode's first messages
    reply = await proc.step(action)              # StepReply: observation, reward, done, tool counts
    reply = await proc.run(task, policy, idle)   # a harness (proc.kind == "harness"): its whole episode
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
from collections.abc import Awaitable, Callable
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
    gateway_socket: str = ""  # the chat endpoint's Unix socket, which a harness may connect to
    verifiers: str = ""  # a verifiers environment id (task.environment.verifiers) instead of `name`

    @classmethod
    def from_spec(cls, env: Any, gateway_socket: str = "") -> EnvConfig:
        return cls(
            env.name, dict(env.args), env.step_timeout_seconds, env.cpu_seconds, env.memory_mib, gateway_socket,
            env.verifiers,
        )  # fmt: skip

    @property
    def field(self) -> str:
        return "task.environment.verifiers" if self.verifiers else "task.environment.name"


@dataclass
class HarnessReply:
    reward: float | None
    tool_calls: int = 0
    tool_failures: int = 0


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
        self.kind = "steps"  # "harness": the environment drives its episode through the chat endpoint (`run`)

    @classmethod
    async def start(cls, config: EnvConfig) -> EnvProcess:
        child = {"name": config.name, "args": config.args, "memory_mib": config.memory_mib}
        child.update(cpu_seconds=config.cpu_seconds, gateway_socket=config.gateway_socket, verifiers=config.verifiers)
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
            named = config.verifiers or config.name
            raise EnvFailure("load", f"{config.field} {named!r}: {reply.get('detail', reply)}")
        self.netns = bool(reply.get("netns"))
        self.kind = str(reply.get("kind", "steps"))
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

    async def run(self, task: Example, policy: dict[str, Any], idle: Callable[[], float]) -> HarnessReply:
        """A harness's episode. Its model turns take what they take; `idle()` (seconds without a turn in flight:
        the harness's own time) may not pass the step timeout."""
        reply = await self.call({"op": "run", "task": asdict(task), "policy": policy}, idle)
        try:
            return HarnessReply(reply["reward"], int(reply.get("tool_calls", 0)), int(reply.get("tool_failures", 0)))
        except (KeyError, TypeError, ValueError) as err:
            await self.kill()
            raise EnvFailure("bad_reply", f"run(): {err}") from None

    async def call(self, request: dict[str, Any], idle: Callable[[], float] | None = None) -> dict[str, Any]:
        """One request and its reply within the step timeout (of idle time, with `idle`); EnvFailure (the process
        is gone) otherwise."""
        if not self.alive:
            raise EnvFailure("crash", "the environment's process already ended")
        assert self.proc.stdin is not None
        self.busy = True
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            await self.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died: the reply's EOF says how
        reply = await self._reply(self.config.step_timeout_s, idle)
        self.busy = False
        if "fail" in reply:
            await self.kill()
            raise EnvFailure(str(reply["fail"]), str(reply.get("detail", ""))[:500])
        return reply

    async def _reply(self, timeout: float, idle: Callable[[], float] | None = None) -> dict[str, Any]:
        """The next reply line; EnvFailure (after killing the process) on a timeout, EOF or a broken line."""
        assert self.proc.stdout is not None
        try:
            read = self.proc.stdout.readline()
            line = await (asyncio.wait_for(read, timeout) if idle is None else _idle_bounded(read, timeout, idle))
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


async def _idle_bounded(read: Awaitable[bytes], timeout: float, idle: Callable[[], float]) -> bytes:
    """`read`'s result, unless `idle()` passes `timeout` first (TimeoutError): waits on the read with a deadline
    that moves each time the idle clock restarts."""
    task = asyncio.ensure_future(read)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=max(0.01, timeout - idle()))
            if done:
                return task.result()
            if idle() >= timeout:
                raise TimeoutError
    finally:
        task.cancel()


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
