"""Run a registered reward confined: a small pool of long-lived sandbox processes scoring batches of samples.

`RewardSandbox(reward, limits)` (reward: an entry point name or a weighted list of them, see `task.reward`) starts `limits.processes` processes (rlboost.tasks.sandbox_child: own network
namespace where permitted, an audit hook refusing sockets, processes and exec of text, RLIMIT_AS and a per-call
RLIMIT_CPU) and `score(items)` returns one `RewardResult` per (response_text, example), in order. A call that
takes longer than `limits.timeout_seconds`, crashes its process, exceeds a limit, is refused, raises or returns a
non-finite value or a non-number scores 0.0 with a `failure` reason (FAILURE_REASONS); its process is replaced
and the rest of the batch goes on in the new one, so good samples keep their rewards. Replies are JSON, never
pickle: nothing the reward's process writes is executed here. Torch-free.

Scoring is bounded by the pool (issue 31 item 4): the processes take small batches from one queue, so a slow
sample holds one process, not a fixed share of the step; and a call of `score` has a budget
(`limits.step_budget_seconds`, task.rewardStepBudgetSeconds): a sample still running when it ends is cut
(failure 'budget'), and the samples not started by then are not scored (failure 'budget'). A failed sample is
not a real zero: its `failure` says why, the trainer counts it per kind and keeps it out of its group's baseline.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from rlboost.reward_registry import RewardTerms, reward_terms
from rlboost.tasks.base import Example

FAILURE_REASONS = ("timeout", "crash", "cpu", "memory", "refused", "exception", "bad_value", "budget")
QUEUE_BATCH = 8  # samples a process takes from the queue at once: few enough that a slow one holds up few
_MAX_REPLY_BYTES = 64 * 1024  # a reply is a number; anything longer is a broken protocol
_START_TIMEOUT_S = 120.0  # importing the reward's package may be slow on a busy machine


class RewardSandboxError(RuntimeError):
    """The reward cannot be run at all (its package fails to import, or no sandbox process starts)."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one reward call may use (from the job spec's task.reward* fields)."""

    timeout_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_mib: int = 1024
    processes: int = 2
    step_budget_seconds: float = 0.0  # wall time one `score` call may take (0: none)

    @classmethod
    def from_task(cls, task: Any) -> SandboxLimits:
        return cls(
            task.reward_timeout_seconds,
            task.reward_cpu_seconds,
            task.reward_memory_mib,
            task.reward_processes,
            task.reward_step_budget_seconds,
        )


@dataclass(frozen=True)
class RewardResult:
    """A sample's reward; `failure` is None, or the reason it scored 0.0 (one of FAILURE_REASONS)."""

    value: float
    failure: str | None = None
    detail: str = ""


class _Process:
    """One sandbox process and its reply stream."""

    def __init__(self, terms: RewardTerms, limits: SandboxLimits) -> None:
        config = json.dumps({"terms": terms, "memory_mib": limits.memory_mib, "cpu_seconds": limits.cpu_seconds})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlboost.tasks.sandbox_child", config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.stdin, False)
        self._buffer = b""
        self.netns = False

    def wait_ready(self, deadline: float) -> None:
        reply = self.read_reply(deadline)
        if reply is None or not reply.get("ready"):
            detail = reply.get("detail", reply) if isinstance(reply, dict) else "no answer"
            self.kill()
            raise RewardSandboxError(f"task.reward: the reward sandbox did not start: {detail}")
        self.netns = bool(reply.get("netns"))

    def read_reply(self, deadline: float, outgoing: bytearray | None = None) -> dict[str, Any] | None:
        """The next reply line (writing `outgoing` meanwhile); None on timeout, EOF or a broken line."""
        if b"\n" not in self._buffer:
            self._fill(deadline, outgoing)
        if b"\n" not in self._buffer:
            return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None

    def _fill(self, deadline: float, outgoing: bytearray | None) -> None:
        """Read until the buffer holds a whole line, the deadline passes or the process ends."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if outgoing and not _registered(sel, self.stdin):
                    sel.register(self.stdin, selectors.EVENT_WRITE)
                left = deadline - time.monotonic()
                if left <= 0 or len(self._buffer) > _MAX_REPLY_BYTES:
                    return
                for key, _ in sel.select(left):
                    if key.fd == self.stdin:
                        if not self._write(outgoing):
                            sel.unregister(self.stdin)
                    elif not (chunk := os.read(self.stdout, 65536)):
                        return  # EOF: the process ended
                    else:
                        self._buffer += chunk

    def _write(self, outgoing: bytearray | None) -> bool:
        """Write what the pipe takes; False when nothing is left to write (or the process is gone)."""
        if not outgoing:
            return False
        try:
            sent = os.write(self.stdin, outgoing)
        except BlockingIOError:
            return True
        except BrokenPipeError:  # the process ended; its EOF on stdout tells the reader
            outgoing.clear()
            return False
        del outgoing[:sent]
        return bool(outgoing)

    def kill(self) -> int:
        """End the process (if still running) and return how it ended (negative: by that signal)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]
        return self.proc.wait()


def _registered(sel: selectors.BaseSelector, fd: int) -> bool:
    try:
        sel.get_key(fd)
    except KeyError:
        return False
    return True


BUDGET_DETAIL = "the step's reward budget (task.rewardStepBudgetSeconds) ran out"


def _why_ended(returncode: int, reply: dict[str, Any] | None, timed_out: str) -> tuple[str, str]:
    """`timed_out`: '' (no), 'timeout' (the call's own limit) or 'budget' (the step's ran out first)."""
    if reply is not None and reply.get("fail") in FAILURE_REASONS:
        return str(reply["fail"]), str(reply.get("detail", ""))[:500]
    if reply is not None:
        return "bad_value", f"unexpected reply {str(reply)[:200]}"
    if timed_out == "budget":
        return "budget", f"cut: {BUDGET_DETAIL}"
    if timed_out:
        return "timeout", "no reply within task.rewardTimeoutSeconds"
    if returncode == -signal.SIGXCPU:
        return "cpu", "CPU time over task.rewardCpuSeconds"
    return "crash", f"the reward process exited with {returncode}"


class _Work:
    """One `score` call's samples, shared by the pool's threads: the next batch to take, the results in order."""

    def __init__(self, items: list[tuple[str, Example]], deadline: float | None) -> None:
        self.items, self.deadline = items, deadline
        self.results: list[RewardResult | None] = [None] * len(items)
        self._next = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> tuple[int, list[tuple[str, Example]]] | None:
        """The next up to `n` samples (their first index, them), or None: all taken, or the budget ran out."""
        with self._lock:
            if self._next >= len(self.items) or (self.deadline is not None and time.monotonic() >= self.deadline):
                return None
            start, self._next = self._next, min(len(self.items), self._next + n)
            return start, self.items[start : self._next]

    def done(self, start: int, results: list[RewardResult]) -> None:
        self.results[start : start + len(results)] = results

    def finished(self) -> list[RewardResult]:
        """Every result in order; samples never taken (the budget ran out) fail with 'budget'."""
        missing = RewardResult(0.0, "budget", f"not scored: {BUDGET_DETAIL}")
        return [r if r is not None else missing for r in self.results]


class RewardSandbox:
    """A pool of sandbox processes for one reward. Use as a context manager, or start() / close()."""

    def __init__(self, reward: str | Sequence[Any], limits: SandboxLimits | None = None) -> None:
        self.reward, self.limits = reward, limits or SandboxLimits()
        self.terms = reward_terms(reward)  # a name, or a weighted list (rlboost.spec.RewardTerm): summed per sample
        self._idle: list[_Process] = []
        self._pool = ThreadPoolExecutor(self.limits.processes, thread_name_prefix="reward-sandbox")
        self.replaced = 0  # processes replaced after a failed call

    def __enter__(self) -> RewardSandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def network_isolated(self) -> bool:
        """Whether the processes run in their own network namespace (else only the audit hook refuses sockets)."""
        return all(p.netns for p in self._idle)

    def start(self) -> None:
        """Start every process and wait until each has loaded the reward (RewardSandboxError if one cannot)."""
        procs = [_Process(self.terms, self.limits) for _ in range(self.limits.processes)]
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            for p in procs:
                p.wait_ready(deadline)
        except RewardSandboxError:
            for p in procs:
                p.kill()
            raise
        self._idle = procs

    def close(self) -> None:
        for p in self._idle:
            p.kill()
        self._idle = []
        self._pool.shutdown(wait=True)

    def score(self, items: Sequence[tuple[str, Example]], deadline: float | None = None) -> list[RewardResult]:
        """One result per (response_text, example), in order: the pool's processes take batches of QUEUE_BATCH
        from one queue until it is empty or the budget runs out: `deadline` (time.monotonic(); the trainer's
        judge passes what is left of the step's), else `limits.step_budget_seconds` from now (0: none)."""
        if not items:
            return []
        if not self._idle:
            raise RewardSandboxError("the reward sandbox is not started (use it as a context manager)")
        budget = self.limits.step_budget_seconds
        if deadline is None and budget > 0:
            deadline = time.monotonic() + budget
        work = _Work(list(items), deadline)
        n = min(len(self._idle), len(items))
        procs, self._idle = self._idle[:n], self._idle[n:]
        if len(procs) == 1:
            self._idle += [self._drain(procs[0], work)]
        else:
            self._idle += list(self._pool.map(self._drain, procs, [work] * len(procs)))
        return work.finished()

    def _drain(self, proc: _Process, work: _Work) -> _Process:
        """Score batches from `work` on `proc` (replaced after a failure) until none is left or the budget ended."""
        while (batch := work.take(QUEUE_BATCH)) is not None:
            start, chunk = batch
            proc, results = self._run_chunk(proc, chunk, work.deadline)
            work.done(start, results)
        return proc

    def _run_chunk(
        self, proc: _Process, items: list[tuple[str, Example]], until: float | None = None
    ) -> tuple[_Process, list[RewardResult]]:
        """Score `items` in order on `proc`; after a failure the rest go to a fresh process, and once `until` (the
        step's budget) has passed, the rest are not scored."""
        results: list[RewardResult] = []
        while len(results) < len(items):
            if until is not None and time.monotonic() >= until:
                results += [RewardResult(0.0, "budget", f"not scored: {BUDGET_DETAIL}")] * (len(items) - len(results))
                break
            rest = items[len(results) :]
            request = {"items": [[text, asdict(ex)] for text, ex in rest]}
            outgoing = bytearray(json.dumps(request).encode() + b"\n")
            for _ in rest:
                own = time.monotonic() + self.limits.timeout_seconds
                deadline = own if until is None else min(own, until)
                reply = proc.read_reply(deadline, outgoing)
                value = reply.get("r") if reply is not None else None
                if isinstance(value, float) and value == value and abs(value) != float("inf"):
                    results.append(RewardResult(value))
                    continue
                late = reply is None and time.monotonic() >= deadline
                timed_out = ("timeout" if deadline == own else "budget") if late else ""
                reason, detail = _why_ended(proc.kill(), reply, timed_out)
                results.append(RewardResult(0.0, reason, detail))
                proc = self._replacement()
                break
        return proc, results

    def _replacement(self) -> _Process:
        self.replaced += 1
        proc = _Process(self.terms, self.limits)
        proc.wait_ready(time.monotonic() + _START_TIMEOUT_S)
        return proc
