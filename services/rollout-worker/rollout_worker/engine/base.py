"""The engine interface every rollout backend implements: `torch` (torch_engine.py: CPUs, tests) and
`sglang` (sglang_engine.py: GPUs).

An engine generates token streams from `input_ids` (prompt + tokens so far), aborts single requests,
swaps its weights in place between decode iterations and reports the version it holds. When colocated with
the trainer it gives its memory back while the trainer trains and takes it again with exactly the same
weights: hold_for_release() -> release_memory() -> resume_memory(), tracked in `memory_state` (the one record
of it: the worker's heartbeats report `memory_released` from there). Backends implement only the freeing and
the restoring (`_free_memory`, `_restore_memory`). The session (gRPC transport, chunking, weight pulls) only
ever talks to this interface.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from rlboost.wire.rollout_io import Assignment

if TYPE_CHECKING:
    import torch

FINISH_STOP = "stop"  # emitted a stop token (the stop token is part of the response)
FINISH_LENGTH = "length"  # reached max_new_tokens (counting tokens generated before a migration)
FINISH_ABORT = "abort"  # aborted (revoke, drain); the request continues elsewhere


class EngineError(RuntimeError):
    """The engine cannot do what was asked (model does not load, weights do not fit); the message says why."""


class MemoryState(StrEnum):
    """Where an engine's memory is (colocation with the trainer on the same accelerators)."""

    RESIDENT = "resident"  # loaded: generates and takes weights
    RELEASING = "releasing"  # hold_for_release() or release_memory() under way: no new work meanwhile
    RELEASED = "released"  # given back by release_memory(); resume_memory() takes it again


@dataclass
class GenerationStep:
    """Tokens of one request produced since the previous step, and whether the request ended."""

    request_id: str
    offset: int  # index in the response of token_ids[0]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampling-policy log-probability per token
    finished: bool = False  # no more steps follow for this request (also after an abort)
    finish_reason: str = ""  # FINISH_STOP | FINISH_LENGTH | FINISH_ABORT when finished
    # The request failed here by itself (last step, FINISH_ABORT): the cause, one line. The others go on.
    error: str = ""
    invalid_input: bool = False  # with `error`: its input is refused (any engine of this model would refuse it)


def prompt_problem(input_ids: Sequence[int], vocab_size: int) -> str:
    """'' when every id of `input_ids` (prompt + tokens so far) indexes the model's vocabulary, else what is wrong:
    checked at admission, so one bad request is refused alone instead of failing every step of its batch."""
    if not input_ids:
        return "input_ids: empty; a request needs at least one prompt token"
    for position, token in enumerate(input_ids):
        if not 0 <= token < vocab_size:
            return (
                f"input_ids[{position}] = {token} is outside the model's vocabulary (0..{vocab_size - 1}); "
                "tokenize the prompt with this model's tokenizer"
            )
    return ""


def refusal(a: Assignment, vocab_size: int, errors: RepeatedLog) -> GenerationStep | None:
    """The one step of a request refused at admission (its ids are not the model's vocabulary), logged with
    repeats counted; None when it may run. `vocab_size` 0: unknown, nothing is checked."""
    problem = prompt_problem(a.input_ids, vocab_size) if vocab_size else ""
    if not problem:
        return None
    errors.error("request refused: invalid input_ids", f"request refused: {problem}", request_id=a.request_id)
    return GenerationStep(a.request_id, a.generated, [], [], True, FINISH_ABORT, problem, invalid_input=True)


class RepeatedLog:
    """Logs an error once, then counts its repeats: identical errors (same key) within `period_s` of the last line
    logged become one line with their count, instead of a line per decode iteration or per request."""

    def __init__(self, logger: logging.Logger, period_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.logger, self.period_s, self.clock = logger, period_s, clock
        self._seen: dict[str, tuple[float, int]] = {}  # key -> (when its last line was logged, repeats since)

    def error(self, key: str, message: str, exc_info: BaseException | None = None, **extra: object) -> bool:
        """Log `message` (with `exc_info`'s traceback) unless the same key was logged less than `period_s` ago
        (then count it); True if logged."""
        now = self.clock()
        last, repeats = self._seen.get(key, (float("-inf"), 0))
        if now - last < self.period_s:
            self._seen[key] = (last, repeats + 1)
            return False
        if repeats:
            message = f"{message} (and {repeats} more like it in the last {now - last:.0f}s)"
        self._seen[key] = (now, 0)
        self.logger.error(message, exc_info=exc_info, extra={**extra, "repeats": repeats})
        return True

    def flush(self) -> None:
        """Log the counts not logged yet (at close)."""
        for key, (_, repeats) in self._seen.items():
            if repeats:
                self.logger.error(f"{key}: {repeats} more times", extra={"repeats": repeats})
        self._seen.clear()


class Engine(ABC):
    """One generation backend. All methods are called from the worker's asyncio event loop."""

    name: str = "base"
    capacity: int  # concurrent requests it takes (each engine sets it)
    _version: int = 0  # set by start / update_weights: the version generated with now
    _checksum: str = ""  # state_checksum of the state held, set with _version

    @abstractmethod
    async def start(self, model_dir: str, state: Mapping[str, torch.Tensor] | None = None, version: int = 0) -> None:
        """Load the model from `model_dir`; replace its weights with `state` (exact bf16 tensors) when given."""

    @abstractmethod
    def generate(self, assignment: Assignment) -> AsyncIterator[GenerationStep]:
        """Stream the response of one request, continuing after `input_ids[prompt_len:]` when that is not empty.

        Token i of the response is sampled with (seed, position=i), so a continued request produces
        exactly the tokens the uninterrupted one would have. The last step has `finished=True`.
        """

    @abstractmethod
    def abort(self, request_id: str) -> bool:
        """Stop a request now; its stream ends with a FINISH_ABORT step. False if it was not running."""

    @abstractmethod
    async def update_weights(
        self, state: Mapping[str, torch.Tensor], version: int, checksum: str | None = None
    ) -> None:
        """Swap weights in place between decode iterations; requests submitted before finish on the old weights.

        `checksum`: the state_checksum of `state` when the caller already verified it (the weight puller does),
        so the engine does not read the whole state again; computed here when None."""

    @property
    def weight_version(self) -> int:
        """The weight version the engine generates with now."""
        return self._version

    @property
    def weights_checksum(self) -> str:
        """rlboost.weights.checksum.state_checksum of the exact state held (as pulled, bf16)."""
        return self._checksum

    @property
    @abstractmethod
    def running(self) -> int:
        """Requests submitted and not yet finished (queued or decoding)."""

    # ---- colocation: release / resume memory while the trainer trains on the same accelerator ----

    memory_state: MemoryState = MemoryState.RESIDENT  # changed only by the three methods below

    @property
    def memory_released(self) -> bool:
        """True from hold_for_release() (or release_memory()) until resume_memory() returns: the engine takes
        no new request and no weights, and the worker's heartbeats say so (the manager assigns it nothing)."""
        return self.memory_state is not MemoryState.RESIDENT

    def hold_for_release(self) -> None:
        """The first step of a release: take no new work from now on, so the worker can tell the manager
        before it aborts what still runs. release_memory() follows; resume_memory() undoes either."""
        if self.memory_state is MemoryState.RESIDENT:
            self.memory_state = MemoryState.RELEASING

    async def release_memory(self) -> MemoryReport:
        """Give the engine's memory back (weights, KV cache); only when no request runs (EngineError otherwise,
        and the engine stays as it was). A second call frees nothing (`effective=False`)."""
        if self.memory_state is MemoryState.RELEASED:
            return _nothing_done("release")
        was, self.memory_state = self.memory_state, MemoryState.RELEASING  # no new request while freeing
        t0, before = time.perf_counter(), rss_bytes()
        try:
            self._check_idle("release_memory")
            nbytes, effective = await self._free_memory()
        except BaseException:
            self.memory_state = was
            raise
        self.memory_state = MemoryState.RELEASED
        return MemoryReport("release", nbytes, before, rss_bytes(), time.perf_counter() - t0, effective)

    async def resume_memory(self) -> MemoryReport:
        """Take the memory again after release_memory(), with exactly the weights held before, and take work
        again (after hold_for_release() alone, only the latter)."""
        if self.memory_state is not MemoryState.RELEASED:
            self.memory_state = MemoryState.RESIDENT
            return _nothing_done("resume")
        t0, before = time.perf_counter(), rss_bytes()
        nbytes, effective = await self._restore_memory()
        self.memory_state = MemoryState.RESIDENT
        return MemoryReport("resume", nbytes, before, rss_bytes(), time.perf_counter() - t0, effective)

    async def _free_memory(self) -> tuple[int, bool]:
        """The backend's part of release_memory(), called idle: (bytes given back, whether anything was freed).
        The default frees nothing."""
        return 0, False

    async def _restore_memory(self) -> tuple[int, bool]:
        """The backend's part of resume_memory(): (bytes allocated again, whether anything was restored)."""
        return 0, False

    def _check_idle(self, what: str) -> None:
        if self.running:
            raise EngineError(f"{what}: {self.running} requests still run; abort or finish them first")

    async def close(self) -> None:  # noqa: B027
        """Stop background work; pending streams end with FINISH_ABORT."""


@dataclass
class MemoryReport:
    """What one release_memory() or resume_memory() did (for metrics, logs and the colocation ack)."""

    action: str  # "release" | "resume"
    nbytes: int  # engine bytes given back (release) or allocated again (resume)
    rss_before: int  # resident set size of this process before, bytes (0 where unknown)
    rss_after: int  # ... and after
    seconds: float
    effective: bool = True  # False: nothing was freed (e.g. SGLang without CUDA and the memory saver)


def rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; 0 elsewhere)."""
    import os

    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _nothing_done(action: str) -> MemoryReport:
    """The report of a release or resume with nothing to do (already released, or not released)."""
    rss = rss_bytes()
    return MemoryReport(action, 0, rss, rss, 0.0, effective=False)


def has_weights(model_dir: str) -> bool:
    """Whether a model directory holds its weights (*.safetensors), or only the assets pulled from the weight-server."""
    from pathlib import Path

    return any(Path(model_dir).glob("*.safetensors"))


def read_model_state(model_dir: str) -> dict[str, torch.Tensor]:
    """The exact tensors stored in a HF model directory (its *.safetensors files), for either backend."""
    from pathlib import Path

    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise EngineError(f"cannot load a model from {model_dir}: no *.safetensors file there")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state
