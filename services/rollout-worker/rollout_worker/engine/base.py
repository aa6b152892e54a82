"""The engine interface every rollout backend implements (`torch` here; `sglang` later, issue 8).

An engine generates token streams from `input_ids` (prompt + tokens so far), aborts single requests,
swaps its weights in place between decode iterations and reports the version it holds; when colocated with
the trainer it releases its memory while idle and resumes it with the same weights (release/resume_memory). The session
(gRPC transport, chunking, weight pulls) only ever talks to this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlboost.wire.rollout_io import Assignment

if TYPE_CHECKING:
    import torch

FINISH_STOP = "stop"  # emitted a stop token (the stop token is part of the response)
FINISH_LENGTH = "length"  # reached max_new_tokens (counting tokens generated before a migration)
FINISH_ABORT = "abort"  # aborted (revoke, drain); the request continues elsewhere


class EngineError(RuntimeError):
    """The engine cannot do what was asked (model does not load, weights do not fit); the message says why."""


@dataclass
class GenerationStep:
    """Tokens of one request produced since the previous step, and whether the request ended."""

    request_id: str
    offset: int  # index in the response of token_ids[0]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # sampling-policy log-probability per token
    finished: bool = False  # no more steps follow for this request (also after an abort)
    finish_reason: str = ""  # FINISH_STOP | FINISH_LENGTH | FINISH_ABORT when finished


class Engine(ABC):
    """One generation backend. All methods are called from the worker's asyncio event loop."""

    name: str = "base"

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
    @abstractmethod
    def weight_version(self) -> int:
        """The weight version the engine generates with now."""

    @property
    @abstractmethod
    def weights_checksum(self) -> str:
        """rlboost.weights.checksum.state_checksum of the exact state held (as pulled, bf16)."""

    @property
    @abstractmethod
    def running(self) -> int:
        """Requests submitted and not yet finished (queued or decoding)."""

    # ---- colocation: release / resume memory while the trainer trains on the same accelerator ----

    @property
    def memory_released(self) -> bool:
        """True between release_memory() and resume_memory(): the engine cannot generate or take weights."""
        return getattr(self, "_memory_released", False)

    async def release_memory(self) -> MemoryReport:
        """Give the engine's memory back (weights, KV cache); only when no request runs (EngineError otherwise).

        The default is a no-op that only records the state (`effective=False`); backends override it."""
        self._check_idle("release_memory")
        self._memory_released = True
        return MemoryReport("release", 0, *_rss_pair(), 0.0, effective=False)

    async def resume_memory(self) -> MemoryReport:
        """Take the memory again after release_memory(), with exactly the weights held before."""
        self._memory_released = False
        return MemoryReport("resume", 0, *_rss_pair(), 0.0, effective=False)

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


def _rss_pair() -> tuple[int, int]:
    rss = rss_bytes()
    return rss, rss


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
