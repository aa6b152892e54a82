"""`rlboost simulate` with issue 17's policies: properties on modelled engines and the Bamboo traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rlboost.policies.partial_rollout import may_carry
from rlboost.simulate.cluster import ClusterConfig, Instances, StepSim
from rlboost.simulate.hardware import MODELS
from rlboost.simulate.report import comparison
from rlboost.simulate.runner import (
    ALL_POLICIES,
    HYBRIDS,
    SAME_ALGORITHM_BASELINE,
    SimulationStalledError,
    StepRunner,
    run_policy,
)
from rlboost.simulate.trace import SpotTrace, load_trace
from rlboost.simulate.workload import Workload

TRACES = sorted((Path(__file__).resolve().parents[2] / "traces" / "bamboo").glob("*.csv"))
SMALL = ClusterConfig(MODELS["qwen3-8b"], Workload(prompts_per_step=64))
SYNCHRONOUS = [name for name, f in HYBRIDS.items() if f.staleness == 0]


def summary(cfg: ClusterConfig, policy: str, trace: SpotTrace | None, steps: int = 8) -> dict[str, float]:
    return run_policy(cfg, policy, trace, steps=steps, seed=0).summary(cfg)


@pytest.mark.parametrize("policy", SYNCHRONOUS)
def test_zero_spot_equals_reserved_only(policy: str):
    ours = summary(SMALL, policy, SpotTrace.constant(0))
    reserved = summary(SMALL, "reserved-only", None)
    assert ours["samples_per_s"] == pytest.approx(reserved["samples_per_s"], rel=0.02)
    assert ours["cost_efficiency"] == pytest.approx(reserved["cost_efficiency"], rel=0.02)


def test_zero_spot_with_staleness_is_partial_rollout_on_reserved_never_worse():
    """With staleness 1 and no spot, only partial rollout acts (on the reserved GPUs): never below reserved-only."""
    for policy in ("hybrid+staleness", "rlboost"):
        assert (
            summary(SMALL, policy, SpotTrace.constant(0))["samples_per_s"]
            >= summary(SMALL, "reserved-only", None)["samples_per_s"]
        )


@pytest.mark.parametrize("policy", ["hybrid+length", "hybrid+staleness", "hybrid+tp2"])
def test_more_spot_never_lowers_throughput(policy: str):
    """Without the busy scaler (with it, using less of the spot offered is its choice: see the next test)."""
    figures = [summary(SMALL, policy, SpotTrace.constant(n))["samples_per_s"] for n in (0, 1, 2, 4, 8)]
    assert all(b >= a * 0.99 for a, b in zip(figures, figures[1:], strict=False)), figures
    assert figures[-1] > figures[0] * 1.1


def test_with_the_scaler_more_spot_offered_never_lowers_cost_efficiency_below_reserved_only():
    reserved = summary(SMALL, "reserved-only", None)
    for n in (1, 2, 4, 8):
        ours = summary(SMALL, "rlboost", SpotTrace.constant(n))
        assert ours["cost_efficiency"] >= reserved["cost_efficiency"], n
        assert ours["samples_per_s"] >= reserved["samples_per_s"], n


@pytest.mark.parametrize("trace_path", TRACES, ids=[p.name[:40] for p in TRACES])
def test_cost_efficiency_never_below_reserved_only_with_the_scaler_on(trace_path: Path):
    cfg = ClusterConfig(MODELS["qwen3-8b"], Workload(prompts_per_step=128))
    trace = load_trace(trace_path)
    reserved = summary(cfg, "reserved-only", trace, steps=20)
    for policy in ("hybrid+scaler", "rlboost"):
        ours = summary(cfg, policy, trace, steps=20)
        assert ours["cost_efficiency"] >= reserved["cost_efficiency"], policy
        assert ours["samples_per_s"] >= reserved["samples_per_s"], policy


def test_partial_rollout_trains_the_step_size_and_carries_each_response_at_most_one_version():
    runner = StepRunner(SMALL, "hybrid+staleness", SpotTrace.constant(4))
    reserved = runner.build_reserved(SMALL.reserved_gpus)
    rng = np.random.default_rng(0)
    for k in range(6):
        carried_in = len(runner.carry_need)
        runner.step(k, SMALL.workload.response_lengths(k, 6, rng, runner.fresh_count()), reserved)
        assert runner.result.steps[-1].samples == SMALL.workload.samples_per_step
        # everything carried in was finished and trained on this step: what is carried out is all fresh
        assert len(runner.carry_need) <= round(SMALL.workload.samples_per_step * SMALL.partial_overprovision)
        assert carried_in <= round(SMALL.workload.samples_per_step * SMALL.partial_overprovision)


def test_a_tp2_engine_decodes_a_lone_tail_response_faster():
    def seconds_for_one_long_response(width: int) -> float:
        inst = Instances(SMALL)
        inst.add(True, 0.0, width=width)
        sim = StepSim(SMALL, inst, np.array([8000]), 0.0)
        sim.place()
        t = 0.0
        while not sim.all_done:
            sim.now = t
            sim.decode(SMALL.tick_s)
            t += SMALL.tick_s
        return float(sim.done_at[0])

    assert seconds_for_one_long_response(2) < seconds_for_one_long_response(1) * 0.8  # 4 ms step overhead stays


def test_length_aware_offload_places_the_longest_on_the_emptiest_spot():
    inst = Instances(SMALL)
    reserved = [inst.add(False, 0.0)]
    busy, empty = inst.add(True, 0.0), inst.add(True, 0.0)
    sim = StepSim(SMALL, inst, np.array([9000, 9000, 9000]), 0.0, np.array([10.0, 4000.0, 0.0]), length_aware=True)
    sim.where[:] = reserved[0]
    sim.where[2] = busy
    sim.blocked.add(reserved[0])
    sim.offload(reserved)
    assert sim.where[1] == empty  # the request with the most tokens into the smallest batch
    assert sim.where[0] in (busy, empty)


def test_the_simulator_carries_only_what_the_shared_staleness_bound_lets_cross():
    """At staleness 2 (no built-in policy uses it) a response may cross two versions, never three: the simulator
    keeps to rlboost.policies.partial_rollout.may_carry, the trainer's and the manager's rule."""
    runner = StepRunner(SMALL, "hybrid+staleness", SpotTrace.constant(2))
    runner.features = replace(runner.features, staleness=2)
    reserved = runner.build_reserved(SMALL.reserved_gpus)
    rng, crossed_two = np.random.default_rng(0), False
    for k in range(6):
        runner.step(k, SMALL.workload.response_lengths(k, 6, rng, runner.fresh_count()), reserved)
        assert runner.result.steps[-1].samples == SMALL.workload.samples_per_step
        assert all(may_carry(int(v), k + 1, 2) for v in runner.carry_version)
        crossed_two |= bool(np.any(runner.carry_version < k))  # carried into its third version's step
    assert crossed_two


BURSTY = SpotTrace((0.0, 600.0), (10, 0), 900.0)  # 10 spot VMs for 10 min, none for 5, over and over


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_ends_on_a_trace_whose_spot_falls_to_zero_again_and_again(policy: str):
    """Spot gone mid-step with the reserved GPUs called back to rollout: the step's trainer resumed once its
    samples were in (before the fix, `rlboost` and `hybrid+staleness` looped forever from about step 12 here)."""
    result = run_policy(SMALL, policy, BURSTY, steps=20, seed=0)
    assert len(result.steps) == 20


def test_a_stalled_step_stops_the_run_naming_the_policy_and_the_step():
    runner = StepRunner(SMALL, "rlboost", BURSTY, max_step_s=1.0)  # no step takes under 1 s of simulated time
    reserved = runner.build_reserved(SMALL.reserved_gpus)
    lengths = SMALL.workload.response_lengths(0, 1, np.random.default_rng(0), runner.fresh_count())
    with pytest.raises(SimulationStalledError, match=r"policy 'rlboost': step 0 ran past 1 s of simulated time"):
        runner.step(0, lengths, reserved)


def test_rlboosts_gain_splits_into_partial_rollouts_and_spots():
    """Against `reserved-only+staleness` (the same algorithm, no spot), what remains is spot's; with no spot at all
    rlboost is that baseline (within 2%, as the synchronous hybrids are reserved-only), so spot's share is nothing."""
    trace = SpotTrace.constant(10)
    names = ("reserved-only", SAME_ALGORITHM_BASELINE, "rlboost")
    doc = comparison(SMALL, {p: run_policy(SMALL, p, trace, steps=8, seed=0) for p in names})
    share = doc["spot_share"]
    assert share["same_algorithm_reserved_only_vs_reserved_only"] > 1.0  # partial rollout alone helps
    assert share["rlboost_vs_same_algorithm_reserved_only"] > 1.0  # and spot adds to it
    assert 0.0 < share["spot_share_of_gain"] < 1.0
    none = comparison(SMALL, {p: run_policy(SMALL, p, SpotTrace.constant(0), steps=8, seed=0) for p in names})
    assert none["spot_share"]["rlboost_vs_same_algorithm_reserved_only"] == pytest.approx(1.0, rel=0.02)
    assert none["spot_share"]["spot_share_of_gain"] == pytest.approx(0.0, abs=0.1)
