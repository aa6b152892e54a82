"""A recipe of examples/recipes/ runs as a user runs it: the DAPO recipe (token-mean loss, clip-higher) through the
real `rlboost local` with every service a process, shortened to 2 steps. It checks the path, not learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dapo_recipe_runs_two_steps(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    config = REPO / "examples" / "recipes" / "dapo.yaml"
    run_local("--config", config, "--steps", 2, "--run-dir", tmp_path / "run", "--json-report", report_path)
    report = json.loads(report_path.read_text())
    assert report["ok"] and len(report["steps"]) == 2
    for step in report["steps"]:
        assert step["grad_norm"] > 0 and step["loss"] == step["loss"]  # not NaN
        assert step["logprob_mismatch_max"] >= step["logprob_mismatch_mean"] > 0  # the workers' log-probs differ
