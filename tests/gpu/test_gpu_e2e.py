"""The GPU lane (`make test-gpu`): jobs on one CUDA GPU, run by the real `rlboost local`; the reward must rise.

- torch engine (examples/local-gpu-torch.yaml): the embedded default job on a GPU — one reserved and two spot
  workers on CUDA in bf16, the trainer on NCCL in bf16, delta weight sync. Needs PyTorch with CUDA alone.
  First run on 2026-11-24 on an H100 (figures in docs/benchmarks.md, "GPU lane").
- SGLang (examples/local-gpu.yaml): SGLang on CUDA in bf16. Needs SGLang's CUDA build, which has not yet been
  installed on a machine lent to this project (its wheels are too large to carry to one), so it has never run.

Each skips, saying why, where its needs are missing (every CPU machine, CI's included).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from statistics import mean

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]


def gpu_problem(engine: str) -> str | None:
    """Why this machine cannot run the GPU lane with `engine`, or None."""
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA GPU here (torch {torch.__version__}: torch.cuda.is_available() is False)"
    if engine == "sglang" and importlib.util.find_spec("sglang") is None:
        return "sglang is not installed in this environment (pip install 'rlboost[worker,sglang]' on a GPU machine)"
    return None


def ready_lines(log_dir: Path) -> list[dict]:
    """The 'worker ready' records of every worker's log (JSON lines)."""
    lines = []
    for path in log_dir.glob("*-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"worker ready"' in line:
                lines.append(json.loads(line))
    return lines


def run_and_check(tmp_path: Path, config: str, steps: int, rise: float) -> dict:
    """Run `config`, assert the job finished with every token and the reward rose by `rise`; return the report."""
    report_path = tmp_path / "report.json"
    run_local(
        "--config",
        REPO / "examples" / config,
        "--run-dir",
        tmp_path / "run",
        "--json-report",
        report_path,
        timeout=1800,
    )
    report = json.loads(report_path.read_text())
    rewards = [s["reward_mean"] for s in report["steps"]]
    assert report["ok"] and len(rewards) == steps
    assert mean(rewards[-10:]) >= mean(rewards[:10]) + rise, rewards
    assert report["tokens_lost"] == 0
    return report


@pytest.mark.gpu
def test_default_job_learns_on_a_gpu_with_the_torch_engine(tmp_path: Path) -> None:
    problem = gpu_problem("torch")
    if problem:
        pytest.skip(problem)
    report = run_and_check(tmp_path, "local-gpu-torch.yaml", steps=60, rise=0.08)
    ready = ready_lines(tmp_path / "run" / "logs")
    assert len(ready) == 3 and all(r["device"] == "cuda" and r["dtype"] == "bfloat16" for r in ready), ready
    assert {w["weight_version"] for w in report["workers"]} == {60}, report["workers"]


@pytest.mark.gpu
def test_cpu_example_shape_learns_on_a_gpu_with_sglang(tmp_path: Path) -> None:
    problem = gpu_problem("sglang")
    if problem:
        pytest.skip(problem)
    run_and_check(tmp_path, "local-gpu.yaml", steps=40, rise=0.05)
