"""The records the manager's state machine keeps: a request, a worker, a request's phase, and the check a worker's
output must pass before any of it is kept.

Plain data, apart from `invalid_output`, shared by every part of the state machine (fleet, book, leases,
lifecycle, carry_over, speed_placement, adoption, scheduling), which each own their own bookkeeping of them.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from enum import StrEnum

from rlboost.policies.migration import MigrationReason
from rlboost.wire.rollout_io import SamplingParams, WorkerRegistration


class Phase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    REVOKING = "revoking"  # asked to stop; waiting for the worker's flush (abort chunk) or a deadline
    FINISHED = "finished"


# A sampled token's log-probability lies in (-inf, 0]; the slack above 0 allows for rounding, the floor is far
# below what a float32 softmax gives a token it sampled. Outside: the worker's output is refused.
MIN_LOGPROB, MAX_LOGPROB = -1e4, 1e-3


def invalid_output(token_ids: list[int], logprobs: list[float], vocab_size: int) -> str | None:
    """Why a chunk's tokens cannot be kept ('token_id' or 'logprob'), or None. O(n) in C: min, max and sum."""
    if min(token_ids) < 0 or (vocab_size and max(token_ids) >= vocab_size):
        return "token_id"
    # a NaN makes the sum NaN (min/max are unreliable with NaN), an inf makes it inf
    if not math.isfinite(sum(logprobs)) or min(logprobs) < MIN_LOGPROB or max(logprobs) > MAX_LOGPROB:
        return "logprob"
    return None


@dataclass(slots=True)
class Request:
    id: str
    step: int
    prompt_index: int
    sample_index: int
    prompt: list[int]
    sampling: SamplingParams  # per-sample seed already derived
    weight_version: int
    pending_since: float
    vocab_size: int = 0  # token ids must lie below it (0 = unchecked)
    # packed (int32, float32), not lists: a chunk's tokens are appended as one copy, not an object per token,
    # and go to the trainer packed the same way (list(...) gives them as lists)
    tokens: array = field(default_factory=lambda: array("i"))
    logprobs: array = field(default_factory=lambda: array("f"))
    phase: Phase = Phase.PENDING
    worker: str | None = None
    lease_epoch: int = 0
    workers: list[str] = field(default_factory=list)  # contributors, in order
    assigned_at: float = 0.0
    tokens_at_assign: int = 0  # len(tokens) when its current worker got it: the rest that worker streamed
    revoke_deadline: float = 0.0
    revoke_reason: MigrationReason = MigrationReason.REVOKED
    progress_at: float = 0.0  # when it was assigned or last received a token (the stall deadline runs from here)
    failed_attempts: int = 0  # migrations for a FAILED_ATTEMPT reason
    last_error: str = ""  # what its worker said when it last reported it failed
    failed_on: set[str] = field(default_factory=set)  # workers it failed on: not given back to them while others can
    # partial rollout: the later step whose stream delivers it (None: its own), the version it continues under
    # once its worker flushed it, and (first token offset, version) of each run of tokens when it changed version
    stream: int | None = None
    next_version: int | None = None
    marks: list[tuple[int, int]] = field(default_factory=list)
    episode: str | None = (
        None  # a model turn of this agentic episode: finished, it goes to the env-runner (episodes.py)
    )

    @property
    def stream_step(self) -> int:
        return self.step if self.stream is None else self.stream


@dataclass(slots=True)
class Worker:
    reg: WorkerRegistration
    version: int
    last_seen: float
    running: set[str] = field(default_factory=set)  # RUNNING and REVOKING requests it holds
    draining: bool = False
    memory_released: bool = False  # engine memory released for training (its heartbeat says): kept, assigned nothing
    expired: bool = False  # lease expired; eligible again once it speaks
    tokens_generated: int = 0
    requested_version: int = -1  # last SetWeightVersion sent
    seq: int = 0  # registration order: scheduling visits workers in it
    busy_since: float | None = None  # since when it holds at least one request (None: idle)
    tokens_per_s: float = 0.0  # per-request decode rate, EWMA over the requests that left it (0: none yet)
    sync_s: float = 0.0  # weight-sync time, EWMA from SetWeightVersion to its report of holding it (0: none yet)
    sync_asked_at: float | None = None  # when the manager last sent it SetWeightVersion (None: not waiting)

    @property
    def id(self) -> str:
        return self.reg.worker_id

    @property
    def eligible(self) -> bool:
        return not (self.draining or self.expired or self.memory_released)
