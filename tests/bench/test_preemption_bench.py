"""bench/preemption_bench.py on a tiny job: one `rlboost local` run per kind (SIGTERM notice, SIGKILL), three steps.

The JSON must carry the figures under the names the issue spells, per preemption and per kind, and a preemption
with notice must lose no token (the worker flushes everything before it exits). About a minute on 2 cores.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gpu.lane import bench_command, preemption_lane

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "preemption_bench.py"
KEYS = ("kind", "notice_to_drained_s", "tokens_in_flight", "tokens_kept", "tokens_lost", "tokens_regenerated")


def test_cuda_without_a_gpu_is_one_line() -> None:
    """The GPU lane's command (tests/gpu/lane.py) on this CPU machine: one line, no run started."""
    cmd = bench_command(Path("/nonexistent"), "cuda", ("notice",), 1, 10.0)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--device cuda: no CUDA GPU here" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not Path("/nonexistent").exists()


def test_the_cuda_job_puts_the_trainer_and_every_worker_on_the_gpu(tmp_path: Path) -> None:
    """What `--device cuda` runs is a valid job (the spec's own validation) with NCCL and CUDA torch workers."""
    import yaml

    from rlboost.local.plan import LocalOptions, build_plan
    from rlboost.spec import JobSpec

    sys.path.insert(0, str(BENCH.parent))
    from preemption_bench import CONFIG, job_config

    for device in ("cpu", "cuda"):
        spec = JobSpec.model_validate(yaml.safe_load(job_config(tmp_path / device, CONFIG, 320, device).read_text()))
        pools = (spec.rollout.reserved, spec.rollout.spot)
        assert spec.algorithm.max_new_tokens == 320
        on_gpu = (spec.trainer.backend, [p.gpus_per_worker for p in pools], {p.engine for p in pools})
        assert on_gpu == (("nccl", [1, 1], {"torch"}) if device == "cuda" else ("auto", [0, 0], {"torch"})), device
        # what `rlboost local` starts for it (its plan, no process): every worker on CUDA
        plan = build_plan(spec, LocalOptions(run_dir=tmp_path / device / "run"), itertools.count(40000).__next__)
        workers = [c.argv for c in plan.children if c.role == "rollout-worker"]
        assert len(workers) == 3 and all(("cuda" in argv) == (device == "cuda") for argv in workers), workers


def test_tokens_per_second_per_worker_is_each_pools_rate_over_its_workers() -> None:
    sys.path.insert(0, str(BENCH.parent))
    from preemption_bench import tokens_per_worker

    steps = [
        {"pool_tokens_per_second": {"reserved": 100.0, "spot": 300.0}, "pool_workers": {"reserved": 1, "spot": 2}},
        {"pool_tokens_per_second": {"reserved": 120.0, "spot": 100.0}, "pool_workers": {"reserved": 1, "spot": 1}},
        {"pool_tokens_per_second": {"reserved": 80.0, "spot": 0.0}, "pool_workers": {"reserved": 1}},
    ]
    assert tokens_per_worker(steps) == {"reserved": 100.0, "spot": 125.0}


def test_bad_kind_is_one_line() -> None:
    res = subprocess.run([sys.executable, BENCH, "--kinds", "polite"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--kinds 'polite': give a comma list of notice, silent, expired" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_bench_measures_notice_and_silent_preemptions(tmp_path: Path) -> None:
    """Through the GPU lane's own helper with `--device cpu` (tests/gpu/lane.py): what `make test-gpu` runs on CUDA
    runs here first, on every `make test`."""
    figures = preemption_lane(
        tmp_path,
        "cpu",
        kinds=("notice", "silent"),
        steps=3,
        runs_timeout=560,
        extra=("--plot", str(tmp_path / "p.png")),
    )
    assert figures["device"] == "cpu"
    assert set(figures["summary"]) == {"notice", "silent"}
    for kind, summary in figures["summary"].items():
        assert summary["preemptions"] >= 1, f"no {kind} preemption in 3 steps"
        assert {*KEYS, "resume_s", "first_token_s"} <= set(summary)
    runs = {run["kind"]: run for run in figures["runs"]}
    notices = [p for p in runs["notice"]["preemptions"] if p["kind"] == "notice"]
    assert notices and all(set(KEYS) <= set(p) for p in notices)
    assert all(p["tokens_lost"] == 0 == p["tokens_regenerated"] and p["notice_to_drained_s"] >= 0 for p in notices)
    assert all(p["tokens_kept"] == p["tokens_in_flight"] for p in notices)
    silent = [p for p in runs["silent"]["preemptions"] if p["kind"] == "silent"]
    assert silent and all(p["notice_to_drained_s"] is None and p["detected_after_s"] >= 0 for p in silent)
    resumed = [s for p in notices + silent for s in p["resume_s"]]
    assert resumed and all(s >= 0 for s in resumed)  # moved requests produced tokens again elsewhere
    assert all(0 <= step["share"] <= 1 for run in figures["runs"] for step in run["steps"])
    # the per-step figure is the product's (the step reports); the logs' recomputation over the manager's rollout
    # windows counts no stall the product misses (the product also counts stalls outside those windows)
    for summary in figures["summary"].values():
        assert summary["slot_s_lost"] >= summary["slot_s_lost_from_logs"] - 0.01, summary
    hit = [s for run in figures["runs"] for s in run["steps"] if s["preemptions"]]
    assert hit and all(s["slot_s"] > 0 for s in hit)
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_the_runs_together_stop_at_timeout(tmp_path: Path) -> None:
    """--timeout bounds the runs together (the GPU lane gives them what is left of its 8 minutes): a run still going
    at that bound is stopped and the bench says which bound it passed, in one line."""
    cmd = [sys.executable, BENCH, "--kinds", "notice,silent", "--steps", "50", "--timeout", "3", "--out", tmp_path]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert res.returncode != 0 and "notice: rlboost local ran past --timeout (the runs together)" in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "silent").exists()


def test_a_bound_of_no_time_is_one_line() -> None:
    res = subprocess.run([sys.executable, BENCH, "--timeout", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--timeout 0: give seconds > 0" in res.stderr
    assert "Traceback" not in res.stderr
