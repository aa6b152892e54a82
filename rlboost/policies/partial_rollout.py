"""Partial rollout's rules (algorithm.partialRollout, bounded staleness): pure functions, no I/O, no clock.

One copy of the rules, called by the trainer (`trainer.assembly`, `trainer.partial_assembly`: how many new prompts a step opens, which samples it
trains), the rollout-manager (`rollout_manager.server.GroupTarget`: when a step's stream ends) and the simulator
(`rlboost.simulate.runner.StepRunner`, which applies them to samples: a group of one).

- In flight: a step keeps `in_flight(promptsPerStep, overProvision)` groups in flight, promptsPerStep plus the
  over-provision rounded up, so its stream can end at its target while the longest responses go on; the spec
  rejects a job whose in-flight requests do not fit in rollout.maxStepRequests (`fits_step_limit`). Both live in
  rlboost.step_sizing, below the spec, which validates with them. The step opens `new_groups(...)`: what the
  groups still open from earlier steps leave of that.
- Stream end: the stream ends once `stream_target(target, owed)` groups are complete (`stream_ended`); the rest
  (unfinished responses, with their tokens) is carried into the next step under its weight version.
- Staleness: a sample's lag is its step's weight version minus the version of its OLDEST token (`lag`); it is
  trained (importance-corrected) only while `trainable(lag, maxStaleness)`. An unfinished response may be carried
  into the step of `next_version` while it could still be trained there (`may_carry`). What may not: the
  simulator's step waits for it to finish; the product lets it finish and keeps it out of the loss (counted).

With partialRollout off the rules reduce to the synchronous step: in flight = promptsPerStep, target 0 = every
group owed, nothing left unfinished at the stream's end, every sample on-policy (lag 0).
"""

from __future__ import annotations

from rlboost.step_sizing import fits_step_limit, in_flight  # the spec validates with them too: they live below it

__all__ = [
    "fits_step_limit",
    "in_flight",
    "lag",
    "may_carry",
    "new_groups",
    "stream_ended",
    "stream_target",
    "trainable",
]


def new_groups(in_flight_groups: int, open_groups: int) -> int:
    """New prompts a step opens: the in-flight groups its earlier steps' open groups leave room for."""
    return max(0, in_flight_groups - open_groups)


def stream_target(target_groups: int, owed_groups: int) -> int:
    """Complete groups that end a step's stream: `target_groups` (0: partial rollout off, every group) and never
    more than the groups the stream owes."""
    return owed_groups if target_groups <= 0 else min(target_groups, owed_groups)


def stream_ended(complete_groups: int, target: int) -> bool:
    """Whether the stream may end: `target` (from `stream_target`) groups are complete."""
    return complete_groups >= target


def lag(step_version: int, oldest_token_version: int) -> int:
    """A sample's staleness: versions between the step that trains it and its oldest token's."""
    return step_version - oldest_token_version


def trainable(sample_lag: int, max_staleness: int) -> bool:
    """Whether a sample of this lag counts in the loss: on-policy (0) or stale within algorithm.maxStaleness.
    A negative lag (a version from the future: a confused peer) never does."""
    return 0 <= sample_lag <= max_staleness


def may_carry(oldest_token_version: int, next_version: int, max_staleness: int) -> bool:
    """Whether an unfinished response may continue into the step of `next_version`: it could still be trained
    there. A response with no token yet continues under the next version, so its own version is that one."""
    return trainable(lag(next_version, oldest_token_version), max_staleness)
