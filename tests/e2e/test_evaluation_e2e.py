"""Evaluation end to end: a short `rlboost local` run with spec.evaluation and a weighted reward reports the
validation metrics in the step reports, the JSON report's `validation` list and the trainer's steps.jsonl.

Small on purpose (the tiny model, 3 steps, 8 validation prompts x 4 samples): it checks the path, not learning.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

CONFIG = """
model: {hiddenSize: 64, numLayers: 2, numHeads: 2, warmupSteps: 5}
task:
  numPrompts: 32
  reward:
    - {name: exact_match, weight: 1.0}
    - {name: format, weight: 0.1, params: {style: integer}}
algorithm: {promptsPerStep: 4, groupSize: 4, maxNewTokens: 6, microBatchSize: 16}
evaluation: {everySteps: 2, samples: 4, prompts: 8, temperature: 1.0}
rollout:
  reserved: {replicas: 1, capacity: 16}
  spot: {replicas: 1, capacity: 16}
"""


@pytest.mark.slow
def test_local_run_evaluates_every_k_steps_and_at_the_end(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG)
    run_dir, report_path = tmp_path / "run", tmp_path / "report.json"
    res = run_local("--config", cfg, "--steps", "3", "--run-dir", run_dir, "--json-report", report_path)
    report = json.loads(report_path.read_text())
    validation = report["validation"]
    assert [v["step"] for v in validation] == [1, 2]  # after step 2 of 3 (everySteps) and after the last
    for v in validation:
        assert v["k"] == 4 and v["prompts"] == 8
        assert 0.0 <= v["pass_at_1"] <= v["pass_at_k"] <= 1.0
        assert 0.0 <= v["reward_mean"] <= 1.1  # exact_match + 0.1 x format
        assert v["response_tokens_mean"] > 0
    by_step = {s["step"]: s for s in report["steps"]}
    assert by_step[0]["validation"] is None
    assert [by_step[v["step"]]["validation"] for v in validation] == validation
    assert by_step[2]["weight_version"] == validation[-1]["weight_version"]  # evaluated the published weights
    lines = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [line["validation"] is not None for line in lines] == [False, True, True]
    assert "validation after step 2" in res.stdout
