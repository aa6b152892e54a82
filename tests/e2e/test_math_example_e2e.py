"""The math example (examples/local-math.yaml) end to end, shortened to 4 steps: the real `rlboost local` with every
service a process, through the whole path of a real workload — a JSONL dataset in chat form -> the tiny model's chat
template (recorded in the run) -> the math_verify reward -> validation on the dataset's validation split after the
last step -> JSONL and TensorBoard metrics -> an export that transformers loads and generates from, holding exactly
the final published weights.

It checks the path, not learning (4 steps of a tiny model); the example's full 30 steps are what a user runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]
STEPS = 4


def _trainer_files(run_dir: Path, name: str) -> Path:
    """The one file or directory called `name` under the run directory (the trainer's run dir is inside it)."""
    found = sorted(p for p in run_dir.rglob(name) if "checkpoints" not in p.parts)
    assert found, f"no {name} under {run_dir}"
    return found[0]


@pytest.mark.slow
def test_math_example_runs_dataset_chat_template_math_verify_validation_tracking_and_export(tmp_path: Path) -> None:
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    from rlboost.models import encode_prompt, load_tokenizer
    from rlboost.weights.checksum import state_checksum

    run_dir, report_path = tmp_path / "run", tmp_path / "report.json"
    run_local(
        "--config",
        REPO / "examples" / "local-math.yaml",
        "--steps",
        STEPS,
        "--run-dir",
        run_dir,
        "--json-report",
        report_path,
    )
    report = json.loads(report_path.read_text())
    assert report["ok"] and len(report["steps"]) == STEPS and report["tokens_lost"] == 0

    template = json.loads(_trainer_files(run_dir, "chat_template.json").read_text())
    assert template["template"] and template["sha256"]

    [validation] = report["validation"]  # everySteps 10 > 4 steps: the evaluation after the last step alone
    assert validation["step"] == STEPS - 1 and validation["k"] == 4 and validation["prompts"] == 50
    assert 0.0 <= validation["pass_at_1"] <= validation["pass_at_k"] <= 1.0

    tracking = _trainer_files(run_dir, "tracking")
    lines = [json.loads(x) for x in (tracking / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(STEPS))
    assert "validation/pass_at_1" in lines[-1] and "data_epoch" in lines[-1]
    events = EventAccumulator(str(tracking / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward_mean")] == list(range(STEPS))

    export = Path(report["export_path"])
    model = AutoModelForCausalLM.from_pretrained(export, dtype="auto")
    assert (
        state_checksum({k: v.contiguous() for k, v in model.state_dict().items()}) == report["final_weights_checksum"]
    )
    tok = load_tokenizer(export)
    ids = torch.tensor([encode_prompt(tok, [{"role": "user", "content": "Ivo has 9 books. Ivo gets 6 more."}])])
    assert model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
