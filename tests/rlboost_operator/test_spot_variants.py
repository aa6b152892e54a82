"""The operator's pure side of rollout.spot.variants: one spot Deployment per variant (name, labels, nodeSelector,
GPU requests, replicas, the worker's --variant), the spot ask split across the variants by what their nodes hold,
the busy scaler's price of a spot worker and the status's cost at each variant's price."""

from __future__ import annotations

from datetime import UTC, datetime

import jsonschema
import kubernetes_validate
import pytest

from rlboost.spec import JobSpec, parse_job_spec
from rlboost.wire.events import StepReport
from rlboost_operator import children, crd, spot, spot_ask, spot_busy, status
from rlboost_operator.config import OperatorSettings

K8S_VERSION = "1.30.0"
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"


def variants_spec() -> JobSpec:
    return parse_job_spec(
        {
            "trainer": {"gpusPerRank": 1},
            "rollout": {
                "reserved": {"engine": "sglang", "gpusPerWorker": 1, "nodeSelector": {GKE_ACCELERATOR: "nvidia-h100"}},
                "spot": {
                    "engine": "sglang",
                    "minReplicas": 1,
                    "maxReplicas": 10,
                    "variants": [
                        {
                            "name": "l4",
                            "accelerator": "nvidia-l4",
                            "pricePerGpuHour": 0.7,
                            "maxReplicas": 3,
                            "nodeSelector": {GKE_ACCELERATOR: "nvidia-l4"},
                        },
                        {
                            "name": "a10g",
                            "accelerator": "nvidia-a10g",
                            "pricePerGpuHour": 1.0,
                            "gpusPerWorker": 2,
                            "tensorParallel": 2,
                            "capacity": 96,
                            "nodeSelector": {GKE_ACCELERATOR: "nvidia-a10g"},
                        },
                    ],
                },
            },
            "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.0},
        }
    )


def spot_node(name: str, accelerator: str, gpus: int) -> dict:
    return {
        "metadata": {"name": name, "labels": {"cloud.google.com/gke-spot": "true", GKE_ACCELERATOR: accelerator}},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_each_variant_gets_a_deployment_on_its_nodes_with_its_gpus_and_share():
    spec = variants_spec()
    objs = children.build_children(
        "j", "ns", spec, OperatorSettings(), spot_replicas=5, spot_split={"l4": 3, "a10g": 2}
    )
    by = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    assert "j-workers-spot" not in by  # the pool's single Deployment only without variants
    for name, accelerator, gpus, replicas in [("l4", "nvidia-l4", "1", 3), ("a10g", "nvidia-a10g", "2", 2)]:
        dep = by[f"j-workers-spot-{name}"]
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)
        pod = dep["spec"]["template"]["spec"]
        assert dep["spec"]["replicas"] == replicas
        assert pod["nodeSelector"] == {GKE_ACCELERATOR: accelerator}
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert "rollout-worker-sglang" in pod["containers"][0]["image"]
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels["rlboost.io/pool"] == "spot" and labels[children.VARIANT_LABEL] == name
        assert labels[children.ACCELERATOR_LABEL] == accelerator
        assert dep["spec"]["selector"]["matchLabels"][children.VARIANT_LABEL] == name  # selectors do not overlap
        cmd = pod["containers"][0]["command"]
        assert cmd[cmd.index("--pool") + 1] == "spot" and cmd[cmd.index("--variant") + 1] == name
    assert children.spot_deployments("j", spec) == ["j-workers-spot-l4", "j-workers-spot-a10g"]
    assert ("Deployment", "j-workers-spot-l4") in children.workloads("j", ["l4"])
    ended = children.build_children("j", "ns", spec, OperatorSettings(), spot_replicas=5, finished=True)
    assert all(o["spec"]["replicas"] == 0 for o in ended if o["kind"] == "Deployment")


def test_without_variants_the_single_spot_deployment_is_unchanged():
    spec = parse_job_spec({"rollout": {"spot": {"gpusPerWorker": 1}}})
    objs = children.build_children("j", "ns", spec, OperatorSettings(), spot_replicas=2)
    [dep] = [o for o in objs if o["metadata"]["name"].startswith("j-workers-spot")]
    assert dep["metadata"]["name"] == "j-workers-spot" and dep["spec"]["replicas"] == 2
    assert children.VARIANT_LABEL not in dep["spec"]["selector"]["matchLabels"]
    assert "--variant" not in dep["spec"]["template"]["spec"]["containers"][0]["command"]


def test_the_ask_splits_by_what_each_variants_nodes_hold():
    pool = variants_spec().rollout.spot
    nodes = [
        spot_node("l4-a", "nvidia-l4", 1),
        spot_node("l4-b", "nvidia-l4", 1),
        spot_node("a10g-a", "nvidia-a10g", 4),
    ]
    assert spot.variant_capacity(nodes, pool) == {"l4": 2, "a10g": 2}
    assert spot.spot_capacity(nodes, pool) == 4  # the pool's capacity is the variants' together
    # l4 is the cheaper per request slot (0.7 x 1 / 64 < 1.0 x 2 / 96): filled to what its nodes hold, then a10g
    assert spot.variant_split(nodes, pool, 3) == {"l4": 2, "a10g": 1}
    # more than the nodes hold (minReplicas, busy asks): the rest waits for nodes, cheapest first, within max
    assert spot.variant_split(nodes, pool, 6) == {"l4": 3, "a10g": 3}
    assert spot.variant_split(nodes, parse_job_spec({}).rollout.spot, 3) == {}


def test_an_autoscaled_pool_keeps_its_placed_workers_and_asks_cheapest_first_for_the_rest():
    pool = variants_spec().rollout.spot
    assert spot.variant_split([], pool, 4, placed={}) == {"l4": 3, "a10g": 1}  # no node yet: cheapest first
    # L4 spot ran short and the ask shrank to the placed pods + a probe: the A10G workers stay, the probe tries L4
    assert spot.variant_split([], pool, 3, placed={"a10g": 2}) == {"l4": 1, "a10g": 2}
    pods = [
        spot_ask.spot_pod({"metadata": {"labels": {children.VARIANT_LABEL: "a10g"}}, "spec": {"nodeName": n}}, 0.0)
        for n in ("a10g-a", "a10g-b", "going")
    ]
    pods.append(spot_ask.spot_pod({"metadata": {"labels": {children.VARIANT_LABEL: "l4"}}, "spec": {}}, 0.0))
    assert pods[0].variant == "a10g" and pods[-1] == spot_ask.SpotPod(None, variant="l4")
    assert spot_ask.placed_per_variant(pods, doomed_nodes={"going"}) == {"a10g": 2}


def test_status_cost_counts_each_variant_at_its_price():
    spec = variants_spec()
    report = StepReport(
        step=1,
        reward_mean=0.0,
        tokens=3600,
        rollout_seconds=1,
        train_seconds=0,
        sync_seconds=0,
        weight_version=1,
        weights_checksum="x",
    )
    now = datetime(2026, 1, 1, tzinfo=UTC)
    st = status.step_status(report, spec, {"reserved": 1, "spot": 5}, {}, now, spot_variants={"l4": 2, "a10g": 3})
    assert st["costPerHour"] == pytest.approx(2 * 10.0 + 2 * 0.7 + 3 * 2 * 1.0)  # trainer + reserved, l4, a10g
    assert st["costEfficiency"] == pytest.approx(3600 * 3600 / st["costPerHour"], rel=1e-3)
    assert st["workers"]["spotVariants"] == [{"name": "l4", "ready": 2}, {"name": "a10g", "ready": 3}]
    jsonschema.Draft4Validator(crd.status_schema()).validate(
        {**st, "workers": {**st["workers"], "spotSplit": status.variant_list({"l4": 1}, "replicas")}}
    )


def test_busy_scaler_prices_a_spot_worker_by_the_same_formula():
    spec = variants_spec()
    prices = spot_busy.prices(spec)
    assert prices.reserved_per_hour == 2 * 10.0 and prices.reserved_gpus == 2
    assert prices.spot_per_instance_hour == pytest.approx(0.7)  # the first worker the split places: an L4
    assert prices.gpus_per_instance == 1
