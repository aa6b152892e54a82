"""A step's size in flight: how many groups a step keeps in flight, and whether they fit one Rollout call's
request bound. Pure arithmetic, below the job spec: the spec validates a job with it (algorithm.partialRollout
against rollout.maxStepRequests), and partial rollout's rules (rlboost.policies.partial_rollout) run by it."""

from __future__ import annotations

import math


def in_flight(per_step: int, over_provision: float, partial: bool = True) -> int:
    """Groups a step keeps in flight: `per_step` plus `over_provision` of it rounded up (partial rollout), or
    exactly `per_step` (synchronous)."""
    return per_step + math.ceil(per_step * over_provision) if partial else per_step


def fits_step_limit(groups: int, group_size: int, max_step_requests: int) -> bool:
    """Whether `groups` groups in flight fit in one Rollout call's request bound (rollout.maxStepRequests)."""
    return groups * group_size <= max_step_requests
