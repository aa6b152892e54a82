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


@pytest.mark.parametrize(
    ("algorithm", "field"),
    [
        ({"advantageNormalization": "whiten"}, "algorithm.advantageNormalization"),
        ({"lossAggregation": "dapo"}, "algorithm.lossAggregation"),
        ({"importanceRatio": "geometric"}, "algorithm.importanceRatio"),
        ({"dualClip": 0.9}, "algorithm.dualClip"),
        ({"dualClip": -1}, "algorithm.dualClip"),
        ({"rolloutCorrection": {"mode": "is"}}, "algorithm.rolloutCorrection.mode"),
        ({"rolloutCorrection": {"level": "batch"}}, "algorithm.rolloutCorrection.level"),
        ({"rolloutCorrection": {"cap": 0.5}}, "algorithm.rolloutCorrection.cap"),
        ({"rolloutCorrection": {"threshold": 2}}, "algorithm.rolloutCorrection.threshold"),
        ({"klEstimator": "k4"}, "algorithm.klEstimator"),
        ({"klInReward": True}, "algorithm.klInReward"),  # klCoef 0
        ({"updatesPerStep": 0}, "algorithm.updatesPerStep"),
        ({"updatesPerStep": 65}, "algorithm.updatesPerStep"),
    ],
)
def test_each_algorithm_variant_is_validated_naming_its_field(algorithm, field):
    with pytest.raises(JobSpecError) as info:
        parse_job_spec({"algorithm": algorithm})
    assert [p.path for p in info.value.problems] == [field]
    assert f"  {field}: " in str(info.value)


def test_the_algorithm_variants_default_to_todays_grpo_and_take_the_recipes_values():
    alg = parse_job_spec({}).algorithm
    assert (alg.advantage_normalization, alg.loss_aggregation, alg.importance_ratio, alg.dual_clip) == (
        "group",
        "sequence",
        "token",
        0.0,
    )
    assert (alg.rollout_correction.mode, alg.kl_estimator, alg.kl_in_reward, alg.updates_per_step) == (
        "none",
        "k3",
        False,
        1,
    )
    alg = parse_job_spec(
        {
            "algorithm": {
                "lossAggregation": "token-mean",
                "dualClip": 3,
                "rolloutCorrection": {"mode": "mask", "level": "sequence", "cap": 3.0},
                "klCoef": 0.01,
                "klInReward": True,
                "klEstimator": "k1",
            }
        }
    ).algorithm
    assert alg.dual_clip == 3.0 and alg.rollout_correction.level == "sequence" and alg.kl_in_reward


def test_trainer_old_logprobs_need_rows_one_version_behind_on_a_trainer_that_keeps_them():
    """rolloutCorrection.oldLogprobs 'trainer' keeps the weights of one version before, whole, on every rank."""
    ok = {"algorithm": {"maxStaleness": 1, "rolloutAhead": 1, "rolloutCorrection": {"oldLogprobs": "trainer"}}}
    assert parse_job_spec(ok).algorithm.rollout_correction.old_logprobs == "trainer"
    field = "algorithm.rolloutCorrection.oldLogprobs"
    stale2 = {"algorithm": {"maxStaleness": 2, "rolloutCorrection": {"oldLogprobs": "trainer"}}}
    assert field in (msg := _err(stale2)) and "maxStaleness 1 (it is 2)" in msg
    tis = {"algorithm": {"maxStaleness": 1, "rolloutCorrection": {"oldLogprobs": "trainer", "mode": "tis"}}}
    assert field in (msg := _err(tis)) and "mode 'none'" in msg
    partial = {
        "algorithm": {"maxStaleness": 1, "partialRollout": True, "rolloutCorrection": {"oldLogprobs": "trainer"}}
    }
    assert field in (msg := _err(partial)) and "'workers'" in msg
    zero3 = {**ok, "trainer": {"zeroStage": 3}}
    assert field in (msg := _err(zero3)) and "trainer.zeroStage 0, 1 or 2" in msg
