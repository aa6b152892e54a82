"""The GPU lane (`make test-gpu`): the CPU example's shape (examples/local-gpu.yaml) on a GPU — SGLang on CUDA in
bf16, the trainer on NCCL in bf16 — run by the real `rlboost local`; the reward must rise as on CPU.

It skips, saying so, where no CUDA GPU or no CUDA build of SGLang is present: every machine this project has
had so far (no GPU has been lent to it), so it has not yet run; whoever first has a GPU runs `make test-gpu` and
records the figures in docs/benchmarks.md.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from statistics import mean

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]


def gpu_problem() -> str | None:
    """Why this machine cannot run the GPU lane, or None."""
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA GPU here (torch {torch.__version__}: torch.cuda.is_available() is False)"
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed in this environment (pip install 'rlboost[worker,sglang]' on a GPU machine)"
    return None


@pytest.mark.gpu
def test_cpu_example_shape_learns_on_a_gpu(tmp_path: Path) -> None:
    problem = gpu_problem()
    if problem:
        pytest.skip(problem)
    report_path = tmp_path / "report.json"
    run_local("--config", REPO / "examples" / "local-gpu.yaml", "--run-dir", tmp_path / "run",
              "--json-report", report_path, timeout=1800)  # fmt: skip
    report = json.loads(report_path.read_text())
    rewards = [s["reward_mean"] for s in report["steps"]]
    assert report["ok"] and len(rewards) == 40
    assert mean(rewards[-10:]) >= mean(rewards[:10]) + 0.05, rewards
    assert report["tokens_lost"] == 0
