"""The weight-distribution model of `rlboost simulate` (rlboost.simulate.weights) and its CLI flags: pure, no I/O."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rlboost.cli.main import main
from rlboost.simulate.cluster import ClusterConfig
from rlboost.simulate.hardware import MODELS
from rlboost.simulate.runner import run_policy
from rlboost.simulate.trace import SpotTrace
from rlboost.simulate.weights import WeightNetwork, server_egress_bytes, wave_seconds
from rlboost.simulate.workload import Workload

SNAPSHOT = MODELS["qwen3-8b"].weight_bytes
NETWORKS = [WeightNetwork(regions=1), WeightNetwork(regions=3)]


@pytest.mark.parametrize("net", NETWORKS, ids=["1-region", "3-regions"])
def test_relays_are_never_slower_than_the_server_alone(net: WeightNetwork):
    for k in (2, 3, 8, 16, 100, 1000):
        assert wave_seconds(SNAPSHOT, k, net, relays=True) <= wave_seconds(SNAPSHOT, k, net, relays=False), k


def test_server_only_wave_grows_linearly_in_the_wave():
    net = WeightNetwork()
    t100, t200, t400 = (wave_seconds(SNAPSHOT, k, net, relays=False) for k in (100, 200, 400))
    assert t400 - t200 == pytest.approx(2 * (t200 - t100))
    assert t400 - t200 == pytest.approx(200 * SNAPSHOT / net.server_link_bytes_s)


@pytest.mark.parametrize("net", NETWORKS, ids=["1-region", "3-regions"])
def test_relay_wave_grows_at_most_by_the_chain_depth(net: WeightNetwork):
    hop = net.chunk_bytes / net.node_link_bytes_s + net.hop_latency_s
    first = wave_seconds(SNAPSHOT, net.regions, net, relays=True)  # one relay per region, no chain
    for k in (10, 100, 1000, 10_000):
        depth = max(net.per_region(k)) - 1
        assert wave_seconds(SNAPSHOT, k, net, relays=True) <= first + depth * hop + 1e-9, k


def test_server_egress_per_version_is_one_payload_per_region_with_relays():
    net = WeightNetwork(regions=2)
    assert server_egress_bytes(SNAPSHOT, 1000, net, relays=True) == 2 * SNAPSHOT
    assert server_egress_bytes(SNAPSHOT, 1000, net, relays=False) == 1000 * SNAPSHOT
    assert server_egress_bytes(SNAPSHOT, 1, net, relays=True) == SNAPSHOT


def test_no_new_instances_cost_nothing():
    for relays in (True, False):
        assert wave_seconds(SNAPSHOT, 0, WeightNetwork(), relays) == 0.0
        assert server_egress_bytes(SNAPSHOT, 0, WeightNetwork(), relays) == 0.0


def test_a_cold_start_wave_without_relays_costs_spot_throughput():
    base = ClusterConfig(MODELS["qwen3-8b"], Workload(prompts_per_step=256), weights=WeightNetwork())
    trace = SpotTrace.constant(100)
    runs = {fanout: run_policy(replace(base, weights_fanout=fanout), "hybrid", trace, 2, 0) for fanout in (True, False)}
    on, off = (runs[f].summary(base) for f in (True, False))
    assert off["cold_start_gpu_hours"] > 10 * on["cold_start_gpu_hours"] > 0
    assert on["samples_per_s"] > off["samples_per_s"]
    assert off["server_egress_bytes_per_version"] > 10 * on["server_egress_bytes_per_version"]


def test_cli_weights_flags_add_fields_and_scale_the_trace(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,2\n600,4\n")
    args = ["simulate", "--trace", str(trace), "--steps", "2", "--json", "--policies", "hybrid", "--peak-instances"]
    rc = main([*args, "40", "--weights-fanout", "off", "--regions", "2", "--prompts-per-step", "64"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    hybrid = doc["policies"]["hybrid"]
    assert hybrid["cold_start_gpu_hours"] > 0
    assert hybrid["server_egress_bytes_per_version"] >= 20 * SNAPSHOT / 2  # 20 VMs at t=0, each from the server
    assert hybrid["mean_spot_instances"] > 4  # scaled: the trace's peak of 4 became 40
    assert doc["weights"] == {"fanout": "off", "regions": 2, "server_gbit": 100.0}
    assert doc["trace_scaled_to_peak"] == 40


def test_cli_rejects_bad_weights_flags(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,2\n")
    assert main(["simulate", "--trace", str(trace), "--regions", "0"]) == 2
    assert "--regions" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--peak-instances", "-1"]) == 2
    assert "--peak-instances" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--weight-server-gbit", "0"]) == 2
    assert "--weight-server-gbit" in capsys.readouterr().err


def test_at_the_traces_own_scale_relays_keep_the_figures_of_the_model_before(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,0\n300,6\n900,3\n")
    docs = []
    for fanout in ("legacy", "on"):
        argv = ["simulate", "--trace", str(trace), "--steps", "4", "--json", "--prompts-per-step", "64"]
        assert main([*argv, "--weights-fanout", fanout]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    legacy, relays = docs
    for policy, fields in legacy["policies"].items():
        kept = {k: v for k, v in relays["policies"][policy].items() if k != "server_egress_bytes_per_version"}
        assert kept == {k: v for k, v in fields.items() if k != "server_egress_bytes_per_version"}, policy
