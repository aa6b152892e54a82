"""Partial rollout's shared rules (rlboost.policies.partial_rollout): property tests with hypothesis.

`run_steps` plays the rules the way the trainer and the rollout-manager chain them, on groups whose responses
finish after a random number of steps: each step opens `new_groups`, ends its stream at `stream_target`, trains
the complete groups whose samples are `trainable` and carries the unfinished ones while `may_carry` allows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlboost import step_sizing
from rlboost.policies.partial_rollout import (
    fits_step_limit,
    in_flight,
    lag,
    may_carry,
    new_groups,
    stream_ended,
    stream_target,
    trainable,
)
from rlboost.spec import JobSpecError, parse_job_spec


@dataclass
class Group:
    opened: int  # the step (= weight version) whose stream it started in: its oldest token's version
    left: int  # steps until its last response finishes (0: finishes in its first step's stream)


@dataclass
class StepLog:
    in_flight: int  # groups in flight during the step's stream
    trained_lags: list[int]  # the lag of each group the step trained
    carried_lags: list[int]  # the lag, at the next step's version, of each group carried into it
    dropped_lags: list[int]  # the same of each unfinished group left behind (kept out of any loss)


def run_steps(prompts: int, over: float, partial: bool, max_staleness: int, durations: list[int]) -> list[StepLog]:
    """Steps until `durations` (how many steps each new group takes) runs out; the rules decide everything else."""
    supply, open_groups, logs, step = iter(durations), [], [], 0
    while True:
        opened = [
            Group(step, d)
            for _, d in zip(
                range(new_groups(in_flight(prompts, over, partial), len(open_groups))), supply, strict=False
            )
        ]
        open_groups += opened
        if not open_groups:
            return logs
        target = stream_target(prompts if partial else 0, len(open_groups))
        # the stream runs until the target: the groups due this step, and the soonest due after it if too few
        by_finish = sorted(open_groups, key=lambda g: g.left)
        complete = by_finish[: max(target, sum(g.left <= 0 for g in open_groups))]
        assert stream_ended(len(complete), target)
        unfinished = by_finish[len(complete) :]
        carried = [g for g in unfinished if may_carry(g.opened, step + 1, max_staleness)]
        trained = [lag(step, g.opened) for g in complete if trainable(lag(step, g.opened), max_staleness)]
        after = [lag(step + 1, g.opened) for g in unfinished]
        logs.append(
            StepLog(
                len(open_groups),
                trained,
                [a for a, g in zip(after, unfinished, strict=True) if g in carried],
                [a for a, g in zip(after, unfinished, strict=True) if g not in carried],
            )
        )
        for g in carried:
            g.left -= 1
        open_groups, step = carried, step + 1


durations_st = st.lists(st.integers(0, 4), min_size=1, max_size=60)
prompts_st = st.integers(1, 16)
over_st = st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 4.0])


@given(prompts_st, over_st, st.integers(1, 4), durations_st)
def test_trained_samples_never_lag_beyond_max_staleness(prompts, over, max_staleness, durations):
    for log in run_steps(prompts, over, True, max_staleness, durations):
        assert all(0 <= lag_ <= max_staleness for lag_ in log.trained_lags)


@given(prompts_st, over_st, st.integers(0, 4), durations_st)
def test_with_partial_rollout_off_every_step_is_synchronous(prompts, over, max_staleness, durations):
    """Every group opened is trained in its own step, on-policy, and nothing is carried."""
    assert in_flight(prompts, over, partial=False) == prompts
    logs = run_steps(prompts, over, False, max_staleness, durations)
    for log in logs:
        assert log.carried_lags == [] and log.dropped_lags == []
        assert log.trained_lags == [0] * log.in_flight
        assert log.in_flight <= prompts
    assert sum(len(log.trained_lags) for log in logs) == len(durations)


@given(prompts_st, over_st, st.booleans(), st.integers(1, 4), durations_st)
def test_groups_in_flight_never_exceed_the_bound(prompts, over, partial, max_staleness, durations):
    bound = in_flight(prompts, over, partial)
    assert prompts <= bound <= prompts * (1 + over) + 1
    for log in run_steps(prompts, over, partial, max_staleness, durations):
        assert log.in_flight <= bound


@given(prompts_st, over_st, st.integers(1, 4), durations_st)
def test_a_carried_response_within_the_bound_is_never_dropped(prompts, over, max_staleness, durations):
    """Only a group its next step could not train is left behind; every other group is trained once complete."""
    logs = run_steps(prompts, over, True, max_staleness, durations)
    for log in logs:
        assert all(0 < a <= max_staleness for a in log.carried_lags)
        assert all(a > max_staleness for a in log.dropped_lags)
    trained, dropped = sum(len(log.trained_lags) for log in logs), sum(len(log.dropped_lags) for log in logs)
    assert trained + dropped == len(durations)
    assert dropped <= sum(d > max_staleness for d in durations)  # only responses that outlive the bound


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 8))
def test_may_carry_is_exactly_the_staleness_bound_at_the_next_version(oldest, next_version, max_staleness):
    assert may_carry(oldest, next_version, max_staleness) == (0 <= next_version - oldest <= max_staleness)
    assert not trainable(-1, max_staleness)  # a version from the future is never trained
    assert trainable(0, max_staleness)  # on-policy always is


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_the_stream_target_is_the_goal_bounded_by_what_is_owed(target, owed):
    want = stream_target(target, owed)
    assert want == (owed if target == 0 else min(target, owed))
    assert stream_ended(want, want) and (want == 0 or not stream_ended(want - 1, want))


@given(st.integers(0, 4096), st.integers(0, 4096))
def test_new_groups_fill_up_to_the_in_flight_count_and_never_go_negative(kept, already_open):
    n = new_groups(kept, already_open)
    assert n >= 0 and (n + already_open == kept or (n == 0 and already_open >= kept))


@given(prompts_st, over_st, st.integers(1, 64), st.integers(1, 65536))
def test_the_step_limit_bounds_the_requests_in_flight(prompts, over, group_size, max_step_requests):
    groups = in_flight(prompts, over)
    assert fits_step_limit(groups, group_size, max_step_requests) == (groups * group_size <= max_step_requests)


def test_the_spec_bounds_groups_in_flight_with_the_policys_arithmetic() -> None:
    """The spec validates with rlboost.step_sizing, the very functions the policy runs by (it may not import a
    policy): 4 prompts + 50% over-provision = 6 groups in flight, x groupSize 4 = 24 requests > 20."""
    assert (in_flight, fits_step_limit) == (step_sizing.in_flight, step_sizing.fits_step_limit)
    algorithm = {"partialRollout": True, "maxStaleness": 1, "promptsPerStep": 4, "groupSize": 4}
    ok = parse_job_spec({"algorithm": {**algorithm, "partialRolloutOverProvision": 0.25}})
    assert ok.partial_rollout_groups() == in_flight(4, 0.25) == 5
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(
            {"algorithm": {**algorithm, "partialRolloutOverProvision": 0.5}, "rollout": {"maxStepRequests": 20}}
        )
    assert err.value.problems[0] == (
        "algorithm.partialRolloutOverProvision",
        "6 groups in flight x algorithm.groupSize exceeds rollout.maxStepRequests (20); lower the over-provision or "
        "raise the limit",
    )
