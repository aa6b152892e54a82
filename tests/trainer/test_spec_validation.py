"""Job specs that cannot train fail before anything starts, naming the field (pure: no process, no torch)."""

from __future__ import annotations

import pytest

from rlboost.spec import JobSpecError, effective_micro_batch, parse_job_spec


def _err(data: dict) -> str:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec(data)
    return str(info.value)


def test_batch_not_divisible_by_ranks_times_micro_batch_names_the_fields():
    msg = _err({"algorithm": {"promptsPerStep": 4, "groupSize": 3, "microBatchSize": 4}, "trainer": {"ranks": 2}})
    assert "algorithm.microBatchSize (4)" in msg and "per-rank batch" in msg and "= 6" in msg
    msg = _err({"algorithm": {"promptsPerStep": 3, "groupSize": 3}, "trainer": {"ranks": 2}})
    assert "trainer.ranks (2)" in msg


def test_group_size_below_two_and_impossible_backend_name_the_field():
    assert "algorithm.groupSize" in _err({"algorithm": {"groupSize": 1}})
    assert "trainer.zeroStage" in _err({"trainer": {"zeroStage": 4}})
    assert "trainer.backend 'nccl' needs GPUs" in _err({"trainer": {"backend": "nccl"}})
    assert "algorithm.lossAggregation" in _err({"algorithm": {"lossAggregation": "batch"}})
    assert "algorithm.maxStaleness" in _err({"algorithm": {"maxStaleness": -1}})


def test_micro_batch_larger_than_a_ranks_share_is_capped():
    spec = parse_job_spec({"algorithm": {"promptsPerStep": 2, "groupSize": 3, "microBatchSize": 32}})
    assert effective_micro_batch(spec) == 6
    two = parse_job_spec(
        {"algorithm": {"promptsPerStep": 4, "groupSize": 4, "microBatchSize": 4}, "trainer": {"ranks": 2}}
    )
    assert effective_micro_batch(two) == 4 and two.trainer.checkpoint_every == 10


def test_partial_rollout_takes_any_ranks_but_keeps_the_even_batch_and_the_staleness_bound():
    two = {"algorithm": {"partialRollout": True, "maxStaleness": 1, "promptsPerStep": 4}, "trainer": {"ranks": 2}}
    assert parse_job_spec(two).trainer.ranks == 2  # short rounds are padded (trainer.ranks.complete_round)
    uneven = {"algorithm": {**two["algorithm"], "promptsPerStep": 3, "groupSize": 3}, "trainer": {"ranks": 2}}
    assert "trainer.ranks (2)" in _err(uneven)
    assert "set algorithm.maxStaleness >= 1" in _err({**two, "algorithm": {"partialRollout": True}})
