"""Tracking and export end to end: a short `rlboost local` run (every real service as a process on 127.0.0.1)
with logging.backends jsonl + tensorboard and export.path. The JSONL and TensorBoard logs hold one entry per
step with the step report's metrics; the export, named by the JSON report's export_path, is a Hugging Face
model directory that transformers loads and generates from, holding exactly the final published weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

CONFIG = """
model: {{hiddenSize: 64, numLayers: 2, numHeads: 2, warmupSteps: 5}}
task: {{numPrompts: 32}}
algorithm: {{steps: 3, promptsPerStep: 2, groupSize: 2, maxNewTokens: 4, microBatchSize: 4}}
trainer: {{checkpointEvery: 1}}
rollout:
  reserved: {{replicas: 1, capacity: 8}}
  spot: {{replicas: 0, capacity: 8}}
logging: {{backends: [jsonl, tensorboard], dir: {logs}}}
export: {{path: {export}, everyCheckpoints: 2}}
"""
METRICS = {
    "reward_mean",
    "loss",
    "kl",
    "entropy",
    "grad_norm",
    "response_length/p50",
    "response_length/max",
    "rollout_seconds",
    "train_seconds",
    "sync_seconds",
    "sync_bytes",
    "cost_so_far",
}


@pytest.mark.slow
def test_local_run_logs_every_step_and_exports_a_loadable_model(tmp_path: Path) -> None:
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    from rlboost.models import encode_prompt, load_tokenizer
    from rlboost.weights.checksum import state_checksum

    logs, export = tmp_path / "logs", tmp_path / "export" / "policy"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG.format(logs=logs, export=export))
    run_dir = tmp_path / "run"
    run_local("--config", cfg, "--run-dir", run_dir, "--json-report", tmp_path / "report.json", "--temperature", "0")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and report["export_path"] == str(export)

    lines = [json.loads(x) for x in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert set(lines[0]) >= METRICS
    assert [x["reward_mean"] for x in lines] == [s["reward_mean"] for s in report["steps"]]
    events = EventAccumulator(str(logs / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) >= METRICS
    assert [e.step for e in events.Scalars("reward_mean")] == [0, 1, 2]

    assert (export.parent / "policy-step-00000002" / "config.json").is_file()  # the 2nd checkpoint's export
    model = AutoModelForCausalLM.from_pretrained(export, dtype="auto")
    bf16 = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert state_checksum(bf16) == report["final_weights_checksum"]
    tok = load_tokenizer(export)
    ids = torch.tensor([encode_prompt(tok, [{"role": "user", "content": "What is 1 + 2?"}])])
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape[1] > ids.shape[1]
