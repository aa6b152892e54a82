"""The typed step tally (trainer.tally): counts, clock and training sums that both kinds of step fill."""

from __future__ import annotations

from trainer.grpo import LossStats
from trainer.tally import StepClock, StepCounts, StepTally, TrainSums


def test_finish_reasons_are_counted_with_an_empty_one_as_a_question_mark() -> None:
    counts = StepCounts(skipped=2)
    for reason in ("stop", "stop", "", "failed"):
        counts.finished(reason)
    assert counts.finish_reasons == {"stop": 2, "?": 1, "failed": 1} and counts.skipped == 2
    assert (counts.off_policy, counts.stale, counts.stale_tokens, counts.carried_over) == (0, 0, 0, 0)


def test_the_first_arrival_dates_the_first_trajectory_once() -> None:
    clock = StepClock(start=0.0)
    clock.arrived()
    first = clock.first_trajectory
    assert first is not None and first > 0
    clock.arrived()
    assert clock.first_trajectory == first


def test_training_sums_add_loss_stats_and_compute_seconds() -> None:
    sums = TrainSums()
    sums.add(0.5, LossStats(10, 1, 2.0, 0.5), 1.0)
    sums.add(0.25, LossStats(6, 2, 1.0, 0.25), 0.5)
    assert (sums.loss, sums.stats, sums.compute_s) == (0.75, LossStats(16, 3, 3.0, 0.75), 1.5)
    assert StepTally().sums == TrainSums() and StepTally().counts == StepCounts()  # each step starts from zero
