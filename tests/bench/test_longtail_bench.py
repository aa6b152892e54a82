"""bench/longtail_bench.py without running a job: the specs it generates, its run order and its figures' schema.

The figures are computed from a report built with the real LocalReport/StepReport models and a trainer log in
the trainer's structured format, so a renamed report field breaks this test rather than the next bench run.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from rlboost.local.report import LocalReport
from rlboost.wire.events import StepReport

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("longtail_bench", ROOT / "bench" / "longtail_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _bench()
BASE = yaml.safe_load(bench.BASE_CONFIG.read_text())


def test_specs_differ_only_in_offload_and_staleness() -> None:
    specs = {name: bench.spec_for(BASE, c, 1.5, 6, 7) for name, c in bench.CONFIGS.items()}
    for name, spec in specs.items():
        config = bench.CONFIGS[name]
        assert spec["rollout"]["offloadWindowS"] == (1.5 if config.offload else 0.0)
        assert (spec["algorithm"]["steps"], spec["algorithm"]["seed"]) == (6, 7)  # same seed everywhere
        stale = {"maxStaleness": 1, "partialRollout": True} if config.staleness else {}
        assert {k: spec["algorithm"][k] for k in stale} == stale
        assert "partialRollout" not in spec["algorithm"] or config.staleness
    assert specs["off-s0"]["model"] == specs["on-s1"]["model"] and BASE["algorithm"]["steps"] != 6  # base untouched


def test_staleness_zero_specs_validate_and_staleness_one_is_accepted_or_named() -> None:
    for name in ("off-s0", "on-s0"):
        assert bench.rejection(bench.spec_for(BASE, bench.CONFIGS[name], 1.0, 4, 0)) == ""
    why = bench.rejection(bench.spec_for(BASE, bench.CONFIGS["on-s1"], 1.0, 4, 0))
    assert why == "" or "partialRollout" in why  # before the partial-rollout merge the spec names the field


def test_run_order_alternates_configurations() -> None:
    configs = bench.parse_configs("off-s0,on-s0")
    assert [(c.name, r) for c, r in bench.run_order(configs, 2)] == [
        ("off-s0", 0),
        ("on-s0", 0),
        ("off-s0", 1),
        ("on-s0", 1),
    ]
    with pytest.raises(SystemExit, match="choose from"):
        bench.parse_configs("off-s0,fast")


def _step(step: int, trajectories: int) -> StepReport:
    return StepReport(
        step=step,
        weight_version=step + 1,
        weights_checksum="x",
        reward_mean=0.0,
        tokens=100 * trajectories,
        trajectories=trajectories,
        rollout_seconds=1.0,
        train_seconds=0.1,
        sync_seconds=0.1,
        response_length={"p50": 90.0, "p90": 300.0, "max": 448.0},
    )


def test_figures_and_summary_schema(tmp_path: Path) -> None:
    report = LocalReport(
        steps=[_step(0, 8), _step(1, 8), _step(2, 6)], migrations=5, migrations_by_reason={"offload": 3, "rebalance": 2}
    )
    log = tmp_path / "trainer.log"
    lines = [{"ts": 100.0 + 2 * s * s, "msg": "step done", "step": s} for s in range(3)]  # walls 2 s then 6 s
    log.write_text("not json\n" + "\n".join(json.dumps(x) for x in lines) + "\n")
    run = bench.run_figures(json.loads(report.model_dump_json()), bench.step_done_times(log), 8, steps_asked=3)
    assert run["step_wall_seconds"] == [2.0, 6.0]
    assert run["samples_per_second"] == round(14 / 8, 3)
    assert (run["offloaded"], run["migrated"], run["lost_samples"]) == (3, 5, 2)
    run |= {"config": "on-s0", "repeat": 0, "exit_code": 0, "load_before": 1.0, "load_after": 2.0}
    summary = bench.summarize([run, run])
    assert summary["step_wall_median_s"] == 4.0 and summary["step_wall_p90_s"] == 6.0
    assert (summary["offloaded"], summary["lost_samples"], summary["load_avg_1m"]) == (6, 4, 1.5)
    json.dumps(summary)  # the --json output is plain JSON
    died = bench.run_figures({"ok": False, "error": "exit 1"}, {}, 8, steps_asked=3)
    assert (died["ok"], died["lost_samples"], died["step_wall_seconds"]) == (False, 24, [])
