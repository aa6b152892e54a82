"""Domain types of the env-runner boundary (agentic episodes; the gRPC edge converts them in `episode_proto`).

An env-runner attaches to the rollout-manager, is handed episodes (`EpisodeAssignment`), asks for each model turn
(`TurnRequest`: the episode's tokens so far), gets its tokens back (`TurnResult`) and ends with the whole episode
(`EpisodeResult`), which the manager delivers to the trainer as a `Trajectory`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from rlboost.wire.rollout_io import EpisodeStats, SamplingParams, Trajectory

MAX_RUNNER_CAPACITY = 100_000  # episodes one env-runner may drive at once (a registration above it is refused)
MAX_TURNS = 1000  # algorithm.maxTurns's bound; a turn number past it is refused on the wire


def turn_request_id(episode_id: str, turn: int) -> str:
    """The id of one model turn's generation request: the episode's id and the turn's number."""
    return f"{episode_id}-t{turn}"


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of one turn: stable, independent of the worker, different from every other turn's (a
    turn's draws restart at token position 0)."""
    key = f"{episode_seed}/turn/{turn}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 63) - 1)


@dataclass
class RunnerRegistration:
    runner_id: str  # unique per process (pod name on Kubernetes)
    node: str
    capacity: int  # episodes at once


@dataclass
class EpisodeAssignment:
    """One episode handed to an env-runner: the environment's task and how to sample the model's turns."""

    episode_id: str
    lease_epoch: int  # fences turn requests and results of an assignment that was taken away
    step: int
    prompt_index: int
    sample_index: int
    task_json: str  # the dataset row as JSON (question, answer, messages, metadata)
    sampling: SamplingParams  # the episode's seed; max_new_tokens is each turn's budget
    weight_version: int
    max_turns: int
    max_episode_tokens: int


@dataclass
class TurnRequest:
    episode_id: str
    lease_epoch: int
    turn: int  # 0-based
    input_ids: list[int]  # the episode's tokens so far, its first prompt included
    max_new_tokens: int  # this turn's budget


@dataclass
class TurnResult:
    """A model turn's sampled tokens; finish_reason 'failed' (with `error`) when the turn could not be generated."""

    episode_id: str
    turn: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "failed"
    weight_version: int  # its oldest token's version
    version_spans: list[tuple[int, int]] = field(default_factory=list)  # when its tokens span several versions
    workers: list[str] = field(default_factory=list)
    error: str = ""

    @classmethod
    def of(cls, episode_id: str, turn: int, traj: Trajectory, error: str = "") -> TurnResult:
        """The result of a turn's finished request (its trajectory, as the manager's lifecycle made it)."""
        return cls(
            episode_id,
            turn,
            list(traj.response_ids),
            list(traj.logprobs),
            traj.finish_reason,
            traj.weight_version,
            list(traj.version_spans),
            list(traj.workers),
            error,
        )


@dataclass
class EpisodeResult:
    """A finished episode, everything after its first prompt in order (see Trajectory.loss_mask)."""

    episode_id: str
    lease_epoch: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # one per response token; 0 at environment tokens
    loss_mask: bytes  # one byte per response token: 1 the model's, 0 the environment's
    finish_reason: str  # "stop" | "length" | "failed"
    turns: int
    version_spans: list[tuple[int, int]] = field(default_factory=list)
    reward: float | None = None  # the environment's score (None: task.reward judges it)
    stats: EpisodeStats = field(default_factory=EpisodeStats)
    workers: list[str] = field(default_factory=list)


@dataclass
class EpisodeCancel:
    episode_ids: list[str]
    reason: str
