"""Bit-exact resume mid-epoch on a prompt dataset: `rlboost local` with every real service, a 7-row JSONL dataset
of chat prompts, 2 prompts per step (so the checkpoint after step 2 sits at position 4 of the first epoch and
the next step's batch spans the epoch's end). `--steps 5` uninterrupted and `--steps 2` then `--steps 5 --resume`
end with the same final weights checksum, and the resumed run's steps report the same epochs. Run it alone with
`.venv/bin/pytest -m slow tests/e2e/test_dataset_resume_e2e.py`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.test_resume_e2e import _run

CONFIG = """
model: {{path: {model}, hiddenSize: 64, numLayers: 2, numHeads: 2, warmupSteps: 5}}
task:
  reward: math_answer
  dataset: {{train: {train}, systemPrompt: "Answer.", maxPromptTokens: 64, shuffleWindowBlocks: 1}}
algorithm: {{promptsPerStep: 2, groupSize: 2, maxNewTokens: 4, microBatchSize: 4, entropyCoef: 0.05, klCoef: 0.05{ahead}}}
trainer: {{checkpointEvery: 2}}
rollout:
  reserved: {{replicas: 1, capacity: 8}}
  spot: {{replicas: 0, capacity: 8}}
"""


def _job(tmp_path: Path, extra: str = "") -> Path:
    """The 7-row dataset and the job over it (`extra`: more algorithm fields)."""
    train = tmp_path / "train.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}], "answer": str(2 * i)} for i in range(7)]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG.format(model=tmp_path / "model", train=train, ahead=extra))
    return cfg


@pytest.mark.slow
def test_dataset_resume_mid_epoch_is_bit_exact(tmp_path: Path) -> None:
    cfg = _job(tmp_path)

    straight = _run(cfg, tmp_path / "a", tmp_path / "ckpt-a", 5)
    assert straight["ok"] and [s["data_epoch"] for s in straight["steps"]] == [0, 0, 0, 1, 1]
    _run(cfg, tmp_path / "b", tmp_path / "ckpt-b", 2)
    manifest = json.loads((tmp_path / "ckpt-b" / "step-00000002" / "manifest.json").read_text())
    assert manifest["state"]["data_cursor"] == {"epoch": 0, "position": 4}
    resumed = _run(cfg, tmp_path / "b", tmp_path / "ckpt-b", 5, "--resume")
    assert [s["step"] for s in resumed["steps"]] == [2, 3, 4]
    assert [s["data_epoch"] for s in resumed["steps"]] == [0, 1, 1]
    assert resumed["final_weights_checksum"] == straight["final_weights_checksum"]


@pytest.mark.slow
def test_a_rollout_run_ahead_reports_each_steps_own_data_epoch(tmp_path: Path) -> None:
    """With the next step's prompts taken while a step trains (algorithm.rolloutAhead), and on-policy as soon as its
    weights are published, a step's report still says the epoch of its own prompts, not of the next step's."""
    cfg = _job(tmp_path, ", maxStaleness: 1, rolloutAhead: 1")
    ahead = _run(cfg, tmp_path / "a", tmp_path / "ckpt-a", 5)
    assert ahead["ok"] and [s["data_epoch"] for s in ahead["steps"]] == [0, 0, 0, 1, 1]
