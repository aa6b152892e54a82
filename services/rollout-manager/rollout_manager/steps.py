"""What a Rollout call may ask of the manager: the job spec's request policy (`RequestPolicy`: bounds on a step's
requests, and what happens when one keeps failing or stalls) and the check of one call against it (`check_step`,
which raises `StepError` naming the field).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlboost.policies.speed_rebalance import MAX_MOVES, MIGRATION_COST_S
from rlboost.spec import MAX_GROUP_SIZE, MAX_NEW_TOKENS, RolloutSpec
from rlboost.wire.episode_io import MAX_TURNS
from rlboost.wire.rollout_io import RolloutRequest

MAX_TASK_BYTES = 1 << 20  # an episode's task (Prompt.task_json): a dataset row, not a dataset


class StepError(ValueError):
    """A Rollout call that cannot be accepted; the message names the field."""


@dataclass(frozen=True)
class RequestPolicy:
    """Bounds on a step's requests and what happens when one keeps failing (the job spec's rollout fields)."""

    max_prompt_tokens: int = 131072
    max_step_requests: int = 1 << 20
    max_attempts: int = 5  # failed attempts (FAILED_ATTEMPT reasons) before the request is reported failed
    drop_failed: bool = False  # True: deliver a failed request as finish_reason "failed"; False: fail its step
    stall_timeout_s: float = 120.0  # a running request with no token for this long is revoked
    speed_migration_cost_s: float = MIGRATION_COST_S  # what a speed-rebalance move is expected to cost (s)
    speed_rebalance_moves: int = MAX_MOVES  # most speed-rebalance moves per balancing pass (0: off)

    @classmethod
    def from_spec(cls, r: RolloutSpec) -> RequestPolicy:
        return cls(
            max_prompt_tokens=r.max_prompt_tokens,
            max_step_requests=r.max_step_requests,
            max_attempts=r.max_request_attempts,
            drop_failed=r.on_failed_request == "drop",
            stall_timeout_s=r.request_stall_timeout_ms / 1000,
            speed_migration_cost_s=r.speed_rebalance_migration_cost_s,
            speed_rebalance_moves=r.speed_rebalance_max_moves,
        )


def check_step(r: RolloutRequest, p: RequestPolicy) -> None:
    """Bounds on one Rollout call, checked before it costs anything; StepError names the field."""
    if r.group_size > MAX_GROUP_SIZE:
        raise StepError(f"rollout.group_size: {r.group_size} is over the limit of {MAX_GROUP_SIZE}")
    if len(r.prompts) * r.group_size > p.max_step_requests:
        raise StepError(
            f"rollout.prompts: {len(r.prompts)} prompts x group_size {r.group_size} is over the limit of "
            f"{p.max_step_requests} requests per step (rollout.maxStepRequests)"
        )
    if r.sampling.max_new_tokens > MAX_NEW_TOKENS:
        raise StepError(f"sampling.max_new_tokens: {r.sampling.max_new_tokens} is over the limit of {MAX_NEW_TOKENS}")
    if len(r.received_request_ids) > p.max_step_requests:
        raise StepError(
            f"rollout.received_request_ids: {len(r.received_request_ids)} ids is over the limit of "
            f"{p.max_step_requests} requests per step (rollout.maxStepRequests)"
        )
    indices = [q.prompt_index for q in r.prompts]
    if len(set(indices)) != len(indices):
        raise StepError("rollout.prompts: prompt_index values must be unique within a step")
    for q in r.prompts:
        if len(q.token_ids) > p.max_prompt_tokens:
            raise StepError(
                f"rollout.prompts[{q.prompt_index}]: {len(q.token_ids)} tokens is over the limit of "
                f"{p.max_prompt_tokens} (rollout.maxPromptTokens)"
            )
        if q.token_ids and (min(q.token_ids) < 0 or (r.vocab_size and max(q.token_ids) >= r.vocab_size)):
            raise StepError(f"rollout.prompts[{q.prompt_index}]: token ids must lie in [0, vocab_size={r.vocab_size})")
        if len(q.task_json) > MAX_TASK_BYTES:
            raise StepError(f"rollout.prompts[{q.prompt_index}].task_json: over the limit of {MAX_TASK_BYTES} bytes")
    if r.episodes is not None:
        _check_episodes(r, p)


def _check_episodes(r: RolloutRequest, p: RequestPolicy) -> None:
    """An episodes step: a turn's budget and the episode's fit what the manager accepts (algorithm.maxTurns, ...)."""
    e = r.episodes
    assert e is not None
    if e.max_turns > MAX_TURNS:
        raise StepError(f"rollout.episodes.max_turns: {e.max_turns} is over the limit of {MAX_TURNS}")
    if e.max_episode_tokens > p.max_prompt_tokens + r.sampling.max_new_tokens:
        raise StepError(
            f"rollout.episodes.max_episode_tokens: {e.max_episode_tokens} is over rollout.maxPromptTokens "
            f"({p.max_prompt_tokens}) + a turn's max_new_tokens: a late turn's prompt would be refused"
        )
