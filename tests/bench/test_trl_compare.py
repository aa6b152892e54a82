"""bench/trl_compare.py without running either job: its JSON's keys, the TRL config it maps from the spec, and the
TRL side's refusal without trl.

Stand-ins: `run_rlboost`, `run_trl` and `model_dir` are replaced by functions returning raw figures of the shape the
real ones return (a real run of either side takes minutes); `importlib.util.find_spec` answers None for "trl" to
play a machine without trl. Everything after them (summaries, the load, the JSON) is the bench's own code.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trl_compare", ROOT / "bench" / "trl_compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _raw(step_s: float, cpu: dict[str, float]) -> dict:
    return {
        "step_seconds": [5.0, step_s, step_s * 2, step_s],
        "tokens": [500, 510, 520, 530],
        "wall_seconds": 9.0,
        "threads": 1,
        "cpu_seconds_per_step": cpu,
    }


def test_json_has_both_sides_step_times_and_their_details(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    monkeypatch.setattr(bench, "model_dir", lambda: tmp_path)
    monkeypatch.setattr(
        bench, "run_rlboost", lambda steps, work, cores, config: _raw(0.2, {"trainer": 0.3, "total": 0.5})
    )
    monkeypatch.setattr(bench, "run_trl", lambda steps, threads, work, cores: _raw(0.4, {"trl": 0.4}))
    out = tmp_path / "trl.json"
    assert bench.main(["--steps", "4", "--cores", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert (figures["rlboost_s_per_step"], figures["trl_s_per_step"]) == (0.2, 0.4)  # medians after step 0
    assert figures["rlboost_over_trl"] == 0.5 and figures["cores"] == 1 and figures["trl_threads"] == 1
    for side in ("rlboost", "trl"):
        details = figures[side]
        assert {"fastest_step_s", "mean_step_s", "tokens_per_s", "threads", "load_before", "load_after"} <= set(details)
        assert details["steps_timed"] == 3 and len(details["load_before"]) == 3
    assert figures["rlboost"]["tokens_per_s"] == round(1560 / 0.8, 1)  # steps 1..3: their tokens over their time
    assert figures["rlboost"]["cpu_seconds_per_step"]["total"] == 0.5


def test_trl_side_refuses_in_one_line_without_trl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    with pytest.raises(SystemExit) as refused:
        bench.run_trl(3, 1, tmp_path, [0])
    message = str(refused.value)
    assert "pip install 'rlboost[compare]'" in message and "--only rlboost" in message and "\n" not in message


def test_trl_config_is_the_default_job_mapped() -> None:
    """The GRPOConfig the TRL side trains with (needs trl; skipped without it)."""
    pytest.importorskip("trl")
    bench = _bench()
    config = bench.trl_config(bench.default_spec(5), "/tmp/unused")
    batch = config.per_device_train_batch_size * config.gradient_accumulation_steps
    assert (batch, config.num_generations, config.per_device_train_batch_size) == (256, 8, 32)
    assert (config.max_completion_length, config.temperature, config.top_p, config.top_k) == (8, 1.0, 1.0, 0)
    assert (config.learning_rate, config.max_grad_norm, config.beta, config.epsilon) == (2e-3, 1.0, 0.0, 0.2)
    assert (config.loss_type, config.scale_rewards, config.num_iterations, config.seed) == ("grpo", "group", 1, 0)
    assert (config.steps_per_generation, config.max_steps, config.shuffle_dataset) == (8, 5, False)


def test_the_timeline_has_the_trainers_publish_per_step(tmp_path: Path) -> None:
    """From the services' log lines (written here as the trainer writes them): per step, "state extracted" to
    "weights uploaded", and the publisher's encode_seconds, medians over the steady steps."""
    bench, lines = _bench(), []
    for step in range(8):
        t = 10.0 + step
        lines.append({"service": "trainer", "msg": "step done", "ts": t})
        lines.append({"service": "trainer", "msg": "state extracted", "ts": t + 0.3})
        lines.append({"service": "trainer", "msg": "weights published", "ts": t + 0.31, "encode_seconds": 0.002})
        lines.append({"service": "trainer", "msg": "weights uploaded", "ts": t + 0.3 + 0.01 * step})
    (tmp_path / "trainer.log").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    timeline = bench.step_timeline(tmp_path)
    assert timeline["trainer_publish_ms_median"] == pytest.approx(35.0, abs=0.2)  # steps 2-5: 20, 30, 40, 50 ms
    assert timeline["trainer_encode_ms_median"] == pytest.approx(2.0)
