"""End to end: `rlboost local` with `trainer.colocateReserved: true`, every service a real process on 127.0.0.1.

The only rollout worker is the reserved one, colocated with the trainer: each step it must release its
engine memory before the trainer trains and resume after the weights are published, then sync to the new
version before the next step's rollout can run at all. Under greedy decoding the run ends with the same
weights, bit for bit, as an uncolocated run with streamed training off (colocation turns streaming off).

Run it with `.venv/bin/pytest -m slow tests/e2e/test_colocation_e2e.py` (under a minute on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_cli import run_local

STEPS = 2
JOB = """\
model: {hiddenSize: 32, numLayers: 1, numHeads: 2, warmupSteps: 0}
task: {numPrompts: 16}
algorithm: {steps: 2, promptsPerStep: 2, groupSize: 2, maxNewTokens: 8, microBatchSize: 4}
trainer: {colocateReserved: %s, streamTraining: false}
rollout:
  reserved: {replicas: 1, capacity: 8}
  spot: {replicas: 0, minReplicas: 0, maxReplicas: 0}
"""


def run(out: Path, colocate: bool) -> dict[str, Any]:
    out.mkdir()
    config = out / "job.yaml"
    config.write_text(JOB % ("true" if colocate else "false"))
    report = out / "report.json"
    run_local(
        "--config",
        config,
        "--steps",
        str(STEPS),
        "--temperature",
        "0",
        "--run-dir",
        out / "run",
        "--json-report",
        report,
        "--dump-rollouts",
        out / "rollouts.jsonl",
        timeout=120,
    )
    return json.loads(report.read_text())


def rollouts(out: Path) -> dict[tuple[int, int, int], list[int]]:
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    return {(d["step"], d["prompt_index"], d["sample_index"]): d["token_ids"] for d in map(json.loads, lines)}


@pytest.mark.slow
def test_colocated_run_releases_and_resumes_every_step_and_matches_uncolocated(tmp_path):
    colocated = run(tmp_path / "colocated", colocate=True)
    assert colocated["ok"] and [s["step"] for s in colocated["steps"]] == list(range(STEPS))
    assert [(s["colocation_released"], s["colocation_resumed"]) for s in colocated["steps"]] == [(1, 1)] * STEPS
    worker_log = (tmp_path / "colocated" / "run" / "logs" / "reserved-0.log").read_text()
    releases = [json.loads(x) for x in worker_log.splitlines() if "engine memory released for training" in x]
    resumes = [json.loads(x) for x in worker_log.splitlines() if "engine memory resumed after training" in x]
    assert [r["step"] for r in releases] == [r["step"] for r in resumes] == list(range(STEPS))
    assert all(r["bytes"] > 0 for r in releases + resumes)
    trainer_log = (tmp_path / "colocated" / "run" / "logs" / "trainer.log").read_text()
    assert trainer_log.count("colocation release acked") == STEPS
    assert trainer_log.count("colocation resume acked") == STEPS

    plain = run(tmp_path / "plain", colocate=False)
    assert all(s["colocation_released"] == 0 for s in plain["steps"])
    assert rollouts(tmp_path / "colocated") == rollouts(tmp_path / "plain")
    assert colocated["final_weights_checksum"] == plain["final_weights_checksum"] != ""
