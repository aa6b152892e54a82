"""Migration: how a request taken off a worker continues elsewhere, losing nothing.

A migrated request goes back to pending with prompt + every token received, and is reassigned with
input_ids = prompt + generated, prompt_len = len(prompt); max_new_tokens stays the whole budget.
If nothing is left to generate (budget spent, or the last token is a stop token) it finishes here.
"""

from __future__ import annotations

from enum import StrEnum

from rlboost.wire.rollout_io import SamplingParams


class MigrationReason(StrEnum):
    """Why a request left its worker (the `reason` label of the migrations metric)."""

    STREAM_BROKEN = "stream_broken"  # the worker's Connect stream ended
    LEASE_EXPIRED = "lease_expired"  # no heartbeat for lease_timeout_ms
    REVOKED = "revoked"  # the manager revoked it (balancing, offload, bad chunk)
    DRAINED = "drained"  # the worker drained (preemption notice or SIGTERM)
    REBALANCE = "rebalance"
    SPEED_REBALANCE = "speed_rebalance"  # a long response moved off a slow worker to a faster idle one
    OFFLOAD = "offload"
    STALLED = "stalled"  # no token for rollout.requestStallTimeoutMs although its worker heartbeats
    INVALID_OUTPUT = "invalid_output"  # its worker sent a token id outside the vocabulary or a bad log-prob
    WORKER_FAILED = "worker_failed"  # its worker reported that generating it failed


# Reasons that count against rollout.maxRequestAttempts: the request's attempt failed (planned moves do not).
FAILED_ATTEMPT = frozenset(
    {
        MigrationReason.STREAM_BROKEN,
        MigrationReason.LEASE_EXPIRED,
        MigrationReason.STALLED,
        MigrationReason.INVALID_OUTPUT,
        MigrationReason.WORKER_FAILED,
    }
)


def continuation(prompt: list[int], generated: list[int]) -> tuple[list[int], int]:
    """input_ids and prompt_len of the assignment that continues a response from exactly where it is."""
    return prompt + generated, len(prompt)


def finish_reason_if_done(generated: list[int], sampling: SamplingParams) -> str | None:
    """'length' or 'stop' when the response needs no more tokens, else None."""
    if generated and generated[-1] in sampling.stop_token_ids:
        return "stop"
    if len(generated) >= sampling.max_new_tokens:
        return "length"
    return None
