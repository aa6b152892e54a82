"""rollout.spot.variants and tensorParallel in the job spec: validation naming the field, the split of spot workers
across variants (rlboost.spec.split_spot_workers) and the one cost formula (JobSpec.cost_per_hour) with a price per
variant."""

from __future__ import annotations

import pytest

from rlboost.spec import JobSpec, JobSpecError, SpotVariantSpec, parse_job_spec, split_spot_workers

L4 = {"name": "l4", "accelerator": "nvidia-l4", "pricePerGpuHour": 0.7, "maxReplicas": 3, "capacity": 32}
A10G = {"name": "a10g", "accelerator": "nvidia-a10g", "pricePerGpuHour": 1.0, "maxReplicas": 8, "capacity": 64}


def spec_with(spot: dict, **rest: dict) -> JobSpec:
    return parse_job_spec({"rollout": {"spot": {"engine": "sglang", **spot}}, **rest})


def problem_paths(data: dict) -> list[str]:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(data)
    return [p.path for p in err.value.problems]


def variant(name: str, price: float, gpus: int = 1, capacity: int = 64, most: int = 16) -> SpotVariantSpec:
    return SpotVariantSpec(
        name=name, price_per_gpu_hour=price, gpus_per_worker=gpus, capacity=capacity, max_replicas=most
    )


def test_no_variants_is_the_single_spot_pool_at_the_spot_price():
    spec = parse_job_spec(
        {
            "trainer": {"gpusPerRank": 1},
            "rollout": {"reserved": {"gpusPerWorker": 1}, "spot": {"gpusPerWorker": 2}},
            "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.5},
        }
    )
    assert spec.rollout.spot.variants == [] and spec.rollout.spot.tensor_parallel == 1
    assert spec.accelerators(1, 3) == (2, 6)
    assert spec.cost_per_hour(1, 3) == 2 * 10.0 + 6 * 2.5
    assert spec.cost_per_hour(1, {"": 3}) == spec.cost_per_hour(1, 3)  # a mapping counts its workers together


def test_split_fills_the_cheapest_per_request_slot_first_within_each_bound():
    cheap, dear = variant("cheap", 0.5, capacity=32, most=2), variant("dear", 1.0, capacity=32, most=8)
    wide = variant("wide", 1.0, gpus=2, capacity=32, most=8)  # 2 GPUs at $1: dearer per slot than `dear`
    assert split_spot_workers(5, [dear, wide, cheap]) == {"dear": 3, "wide": 0, "cheap": 2}
    # capacity: cheap per slot beats price per GPU (0.7 x 1 / 16 > 1.0 x 1 / 64)
    assert split_spot_workers(1, [variant("l4", 0.7, capacity=16), variant("a10g", 1.0)]) == {"l4": 0, "a10g": 1}
    # what the nodes hold bounds the first pass; the rest waits for nodes, cheapest first
    assert split_spot_workers(5, [cheap, dear], {"cheap": 1, "dear": 1}) == {"cheap": 2, "dear": 3}
    assert split_spot_workers(2, [cheap, dear], {"cheap": 0, "dear": 4}) == {"cheap": 0, "dear": 2}
    assert split_spot_workers(99, [cheap, dear]) == {"cheap": 2, "dear": 8}  # never past the maxReplicas
    assert split_spot_workers(0, [cheap, dear]) == {"cheap": 0, "dear": 0}
    tie = [variant("b", 1.0), variant("a", 1.0)]
    assert split_spot_workers(1, tie) == {"b": 1, "a": 0}  # a tie goes to the one listed first


def test_cost_counts_each_variant_at_its_price():
    spec = spec_with(
        {"variants": [L4, {**A10G, "gpusPerWorker": 2, "tensorParallel": 2}]},
        trainer={"gpusPerRank": 1},
        prices={"reservedPerGpuHour": 10.0, "spotPerGpuHour": 99.0},  # unused with variants
    )
    assert spec.accelerators(0, {"l4": 2, "a10g": 3}) == (1, 2 + 6)
    assert spec.cost_per_hour(0, {"l4": 2, "a10g": 3}) == pytest.approx(10.0 + 2 * 0.7 + 6 * 1.0)
    # a total is split as the operator splits it: l4 (0.7/32 per slot) before a10g (2.0/64), l4 up to 3
    assert spec.rollout.spot.per_variant(5) == {"l4": 3, "a10g": 2}
    assert spec.cost_per_hour(0, 5) == pytest.approx(10.0 + 3 * 0.7 + 4 * 1.0)
    assert spec.cost_per_hour(0, 0) == 10.0


def test_variant_pool_is_the_spot_pool_with_the_variants_own_fields():
    spec = spec_with(
        {"nodeSelector": {"team": "rl"}, "resources": {"cpu": "2"}, "variants": [{**L4, "nodeSelector": {"gpu": "l4"}}]}
    )
    pool = spec.rollout.spot.variant_pool("l4")
    assert (pool.engine, pool.gpus_per_worker, pool.capacity, pool.max_replicas) == ("sglang", 1, 32, 3)
    assert pool.node_selector == {"team": "rl", "gpu": "l4"} and pool.resources.cpu == "2"
    with pytest.raises(KeyError, match="no spot variant 'h100'"):
        spec.rollout.spot.variant_pool("h100")


@pytest.mark.parametrize(
    "data, path",
    [
        ({"rollout": {"spot": {"engine": "sglang", "variants": [L4, L4]}}}, "rollout.spot.variants.1.name"),
        (
            {"rollout": {"spot": {"engine": "sglang", "variants": [{**L4, "tensorParallel": 2}]}}},
            "rollout.spot.variants.0.gpusPerWorker",
        ),
        (
            {"rollout": {"spot": {"variants": [{**L4, "gpusPerWorker": 2, "tensorParallel": 2}]}}},
            "rollout.spot.variants.0.tensorParallel",
        ),
        ({"rollout": {"spot": {"variants": [{"name": "l4"}]}}}, "rollout.spot.variants.0.pricePerGpuHour"),
        ({"rollout": {"spot": {"variants": [{**L4, "name": "L4 GPUs"}]}}}, "rollout.spot.variants.0.name"),
        ({"rollout": {"spot": {"minReplicas": 4, "variants": [L4]}}}, "rollout.spot.minReplicas"),
        ({"rollout": {"spot": {"gpusPerWorker": 2, "tensorParallel": 2}}}, "rollout.spot.tensorParallel"),
        (
            {"rollout": {"reserved": {"engine": "sglang", "gpusPerWorker": 1, "tensorParallel": 2}}},
            "rollout.reserved.gpusPerWorker",
        ),
        ({"rollout": {"spot": {"tensorParallel": 9}}}, "rollout.spot.tensorParallel"),
    ],
)
def test_bad_variants_and_tensor_parallel_name_the_field(data, path):
    assert path in problem_paths(data)


def test_messages_say_the_fix():
    with pytest.raises(JobSpecError, match="engine torch requires tensorParallel 1"):
        parse_job_spec({"rollout": {"spot": {"gpusPerWorker": 2, "tensorParallel": 2}}})
    with pytest.raises(JobSpecError, match=r"gpusPerWorker \(1\) must be >= tensorParallel \(2\)"):
        parse_job_spec({"rollout": {"reserved": {"engine": "sglang", "gpusPerWorker": 1, "tensorParallel": 2}}})
    ok = parse_job_spec({"rollout": {"spot": {"engine": "sglang", "gpusPerWorker": 2, "tensorParallel": 2}}})
    assert ok.rollout.spot.tensor_parallel == 2
