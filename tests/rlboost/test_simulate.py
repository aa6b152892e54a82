"""`rlboost simulate`: properties of the policies on modelled engines and real Bamboo traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlboost.cli.main import main
from rlboost.simulate.cluster import ClusterConfig
from rlboost.simulate.hardware import MODELS
from rlboost.simulate.runner import run_policy
from rlboost.simulate.trace import SpotTrace, TraceError, load_trace, parse_trace
from rlboost.simulate.workload import Workload

TRACES = sorted((Path(__file__).resolve().parents[2] / "traces" / "bamboo").glob("*.csv"))
SMALL = ClusterConfig(MODELS["qwen3-8b"], Workload(prompts_per_step=64))


def test_the_bamboo_traces_ship_with_the_repo():
    assert len(TRACES) >= 6, "traces/bamboo/*.csv missing: the trace-driven tests below would not run"


def throughput(cfg: ClusterConfig, policy: str, trace: SpotTrace | None, steps: int = 8) -> float:
    return run_policy(cfg, policy, trace, steps=steps, seed=0).summary(cfg)["samples_per_s"]


def test_hybrid_without_spot_is_reserved_only():
    hybrid = throughput(SMALL, "hybrid", SpotTrace.constant(0))
    reserved = throughput(SMALL, "reserved-only", None)
    assert hybrid == pytest.approx(reserved, rel=0.02)


def test_more_spot_never_lowers_hybrid_throughput():
    figures = [throughput(SMALL, "hybrid", SpotTrace.constant(n)) for n in (0, 1, 2, 4, 8)]
    assert all(b >= a * 0.99 for a, b in zip(figures, figures[1:], strict=False)), figures
    assert figures[-1] > figures[0] * 1.1


def test_runs_are_deterministic_for_a_seed():
    a = run_policy(SMALL, "hybrid", SpotTrace.constant(3), steps=5, seed=7).summary(SMALL)
    b = run_policy(SMALL, "hybrid", SpotTrace.constant(3), steps=5, seed=7).summary(SMALL)
    assert a == b


@pytest.mark.parametrize("trace_path", TRACES, ids=[p.name[:40] for p in TRACES])
def test_hybrid_cost_efficiency_never_below_reserved_only(trace_path: Path):
    cfg = ClusterConfig(MODELS["qwen3-8b"], Workload(prompts_per_step=128))
    trace = load_trace(trace_path)
    hybrid = run_policy(cfg, "hybrid", trace, steps=20, seed=0).summary(cfg)
    reserved = run_policy(cfg, "reserved-only", trace, steps=20, seed=0).summary(cfg)
    assert hybrid["cost_efficiency"] >= reserved["cost_efficiency"]
    assert hybrid["samples_per_s"] >= reserved["samples_per_s"]


def test_trace_parsing_errors_name_the_line():
    assert parse_trace("0,3\n100,5\n").count_at(150) == 5
    with pytest.raises(TraceError, match=":2:"):
        parse_trace("0,3\n10,x\n")
    with pytest.raises(TraceError, match="ascending"):
        parse_trace("10,3\n5,1\n")


def test_cli_prints_json_and_writes_plot(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,0\n600,4\n")
    png = tmp_path / "sim.png"
    rc = main(["simulate", "--trace", str(trace), "--steps", "4", "--json", "--plot", str(png)])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert set(doc["policies"]) == {"reserved-only", "reserved-only+staleness", "disaggregated", "hybrid", "rlboost"}
    assert doc["spot_share"]["rlboost_vs_same_algorithm_reserved_only"] > 0  # the headline's split, beside it
    for fields in doc["policies"].values():
        assert {"samples_per_s", "cost_per_hour", "cost_efficiency", "gpu_utilisation", "bubble_fraction"} <= set(
            fields
        )
    assert png.stat().st_size > 10_000


def test_cli_rejects_bad_input(tmp_path, capsys):
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "trace file not found" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(tmp_path / "x.csv"), "--model", "gpt5"]) == 2
    assert "--model" in capsys.readouterr().err
