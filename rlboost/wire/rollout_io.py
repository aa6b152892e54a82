"""Domain types of the rollout-manager boundary (the gRPC edge converts them in `rollout_proto`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import StrEnum


class Pool(StrEnum):
    """Where a worker runs: reserved (on-demand, colocated with training) or spot (preemptible)."""

    RESERVED = "reserved"
    SPOT = "spot"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 16  # whole response budget
    seed: int = 0  # per-sample seed (or the step's base seed in a RolloutRequest)
    stop_token_ids: tuple[int, ...] = ()  # generation ends after emitting one of these


def sample_seed(base_seed: int, step: int, prompt_index: int, sample_index: int) -> int:
    """The seed of one sample: stable across processes, independent of which worker runs it."""
    key = f"{base_seed}/{step}/{prompt_index}/{sample_index}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def request_id(step: int, prompt_index: int, sample_index: int) -> str:
    """The id of one sample's request; unique within a job."""
    return f"s{step}-p{prompt_index}-g{sample_index}"


@dataclass
class WorkerRegistration:
    worker_id: str  # unique per process (pod name on Kubernetes)
    pool: Pool
    node: str  # host / node name, matched against preemption notices
    capacity: int  # max concurrent requests
    weight_version: int  # version held after the initial pull
    engine: str = "torch"  # "torch" | "sglang"


@dataclass
class Assignment:
    request_id: str
    lease_epoch: int  # fences chunks of a lease that was taken away
    input_ids: list[int]  # prompt + tokens already generated
    prompt_len: int  # input_ids[:prompt_len] is the prompt
    sampling: SamplingParams
    weight_version: int  # version the request must be generated with
    prior_logprobs: list[float] = field(default_factory=list)  # of input_ids[prompt_len:] (may be absent: [])
    ticket: str = ""  # the manager's proof of this assignment, handed back in HeldResponse ('' = none issued)

    @property
    def generated(self) -> int:
        """Tokens of the response already generated before this assignment."""
        return len(self.input_ids) - self.prompt_len


@dataclass
class TokenChunk:
    request_id: str
    lease_epoch: int
    offset: int  # index in the response of token_ids[0]
    token_ids: list[int]  # an array('i') when it came packed (rollout_proto.chunks_from_pb): same reads
    logprobs: list[float]  # one per token; an array('f') when it came packed
    finished: bool = False
    finish_reason: str = ""  # "stop" | "length" | "abort"
    error: str = ""  # the request failed on the worker by itself (last chunk, "abort"): the cause, one line
    invalid_input: bool = False  # with `error`: its input is refused (every worker of this model would refuse it)


@dataclass(frozen=True, slots=True)
class TokenBounds:
    """Extremes over every token of one ChunkBatch, computed once for the whole batch (vectorised), so the
    manager checks a batch's tokens against its bounds without a pass over each chunk."""

    max_token_id: int
    min_logprob: float
    max_logprob: float


@dataclass
class PromptItem:
    prompt_index: int
    token_ids: list[int]
    task_json: str = ""  # agentic episodes: the environment's task (the dataset row as JSON); token_ids is then []


@dataclass(frozen=True)
class EpisodeSettings:
    """A Rollout call whose prompts are environment tasks, each sample an episode (algorithm.maxTurns, ...)."""

    max_turns: int  # model turns per episode
    max_episode_tokens: int  # tokens an episode may hold, its first prompt included


@dataclass
class RolloutRequest:
    step: int
    weight_version: int
    prompts: list[PromptItem]
    group_size: int
    sampling: SamplingParams  # seed: the step's base seed
    vocab_size: int = 0  # token ids must lie in [0, vocab_size); 0 = not checked against a vocabulary
    received_request_ids: list[str] = field(default_factory=list)  # re-attaching: already delivered, not again
    target_groups: int = 0  # partial rollout: end the stream at this many complete groups (0: at every request)
    carried: list[CarriedGroup] = field(default_factory=list)  # partial rollout: earlier steps' samples still owed
    episodes: EpisodeSettings | None = None  # agentic episodes: prompts are tasks, samples are episodes


@dataclass
class CarriedGroup:
    """Samples of an earlier step's group the trainer still waits for (partial rollout)."""

    step: int
    prompt_index: int
    prompt_ids: list[int]
    sample_indices: list[int]
    task_json: str = ""  # agentic episodes: the group's environment task (PromptItem.task_json)


@dataclass
class HeldResponse:
    """A response a worker kept across a broken stream (Register.held): everything generated so far."""

    request_id: str
    weight_version: int  # version its tokens were generated with
    prompt_ids: list[int]
    token_ids: list[int]  # the whole response so far
    logprobs: list[float]  # one per token
    finished: bool = False  # generation ended; otherwise paused mid-response
    finish_reason: str = ""  # "stop" | "length" when finished
    ticket: str = ""  # Assignment.ticket of the assignment the tokens were generated under
    lease_epoch: int = 0  # that assignment's lease_epoch (the ticket covers it)


@dataclass
class Trajectory:
    request_id: str
    step: int
    prompt_index: int
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    weight_version: int
    workers: list[str] = field(default_factory=list)  # workers that generated parts of it, in order
    # partial rollout: (weight version, tokens) per run of response tokens when they span several versions
    # (empty: all at weight_version, which is then the oldest)
    version_spans: list[tuple[int, int]] = field(default_factory=list)
    # agentic episodes: one byte per response token, 1 the model's (trained on), 0 the environment's (masked out of
    # the loss); b"" when every token is the model's. `turns`: model turns (0: a single-turn sample); `reward`: the
    # environment's score (None: task.reward judges the episode)
    loss_mask: bytes = b""
    turns: int = 0
    reward: float | None = None
    episode: EpisodeStats | None = None


@dataclass
class EpisodeStats:
    """What an episode's environment did: its tool calls, their failures and time, and why it failed if it did."""

    tool_calls: int = 0
    tool_failures: int = 0  # malformed calls and errors the tools returned (each an observation, not a crash)
    tool_seconds: float = 0.0  # wall time of the environment's steps, all turns together
    env_error: str = ""  # '' or why the environment failed the episode: crash, timeout, refused, bad_reply
    runner: str = ""  # the env-runner that ran it


@dataclass
class RunnerStatus:
    """One env-runner, as the manager sees it."""

    runner_id: str
    node: str
    capacity: int  # episodes at once
    running: int
    in_tools: int  # of those, between turns (environment stepping)
    draining: bool = False
    episodes_done: int = 0


@dataclass
class EpisodeCounts:
    """The manager's episodes: now and since it started."""

    pending: int = 0
    running: int = 0
    in_tools: int = 0
    finished: int = 0
    failed: int = 0
    idle_slot_seconds_in_tools: float = 0.0  # free worker slot-seconds while episodes were in tools, nothing pending
    runner_episode_seconds: float = 0.0  # episodes the env-runners drove x time, since the manager started
    runner_capacity_seconds: float = 0.0  # the env-runners' capacity x time: utilisation is the ratio of the two
    carried: int = 0  # partial rollout: running on past their step's stream end until a step lists them


@dataclass
class WorkerStatus:
    worker_id: str
    pool: Pool
    node: str
    weight_version: int
    running: int
    capacity: int
    tokens_generated: int
    draining: bool
    memory_released: bool = False  # engine memory released for training (colocation): no new work until resumed
    inflight_tokens: int = 0  # tokens it streamed of responses still running on it (a kill now hands them over)
    tokens_per_s: float = 0.0  # per-request decode rate the manager measured (EWMA; 0: not yet)
    weight_sync_s: float = 0.0  # weight-sync time the manager measured (EWMA; 0: not yet)


@dataclass
class ManagerStatus:
    workers: list[WorkerStatus]
    pending: int
    running: int
    finished: int
    migrations: int
    tokens_received: int  # response tokens received and kept, all workers
    tokens_lost: int = 0  # tokens received but not kept (offset gaps)
    tokens_regenerated: int = 0  # tokens received again for response positions already held
    migrations_by_reason: dict[str, int] = field(default_factory=dict)  # MigrationReason value -> migrations
    # pool -> seconds its workers held at least one request, since the manager started (the spot scaler's busy share)
    busy_seconds: dict[str, float] = field(default_factory=dict)
    runners: list[RunnerStatus] = field(default_factory=list)  # agentic episodes: the env-runners
    episodes: EpisodeCounts = field(default_factory=EpisodeCounts)
    # what preemptions cost (issue 34), since start; the trainer's step report takes the differences
    preemptions: int = 0  # preempted workers (notice, silent, expired)
    preempted_slot_seconds: float = 0.0  # request-seconds moved requests stalled (last token kept -> next token)
    slot_seconds: float = 0.0  # request slot-seconds of the registered workers (capacity x time)
