"""The trainer's side of task.dataset (trainer.prompt_cursor, trainer.assembly): each step's prompts from the dataset through the tiny model's
real chat template, the cursor in the checkpoint manifest and a resume that asks for the same prompts as an
uninterrupted run, the end of the epochs, the chat template recorded in the run directory, bad datasets refused
before the first step.

No peer is contacted: the Trainer's prompt side (prompts.open, assembly.open, _resume_point) runs without NATS, the
manager or the weight-server; the checkpoint is a real manifest (trainer.checkpoint.write_manifest) over a stand-in
file instead of DeepSpeed's, because only its trainer state is read here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlboost.options.trainer import TrainerOptions
from rlboost.spec import JobSpec
from rlboost.tasks.dataset import DatasetError
from tests.trainer.conftest import tiny_spec
from trainer.assembly import OpenedStep
from trainer.checkpoint import CheckpointError, tag_of, write_manifest
from trainer.loop import Trainer


def _dataset(tmp_path: Path, n: int = 30) -> Path:
    path = tmp_path / "train.jsonl"
    lines = [
        {"prompt": [{"role": "user", "content": f"What is {i}+1?"}], "answer": str(i + 1), "id": i} for i in range(n)
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _spec(train: Path, **dataset: object) -> JobSpec:
    data = tiny_spec(prompts_per_step=4).model_dump(by_alias=True)
    data["task"]["dataset"] = {"train": str(train), "metadataFields": ["id"], "systemPrompt": "Be brief.", **dataset}
    return JobSpec.model_validate(data)


def _trainer(tmp_path: Path, model_dir: Path, spec: JobSpec, checkpoints: Path | None = None) -> Trainer:
    opts = TrainerOptions(
        manager="127.0.0.1:1",
        weight_server="http://127.0.0.1:1",
        model_dir=str(model_dir),
        run_dir=str(tmp_path / "run"),
        nats_url="nats://127.0.0.1:1",
        checkpoint_dir=str(checkpoints or ""),
        resume=checkpoints is not None,
    )
    trainer = Trainer(spec, opts, token="t")
    trainer.prompts.open()
    return trainer


def _request(trainer: Trainer, step: int) -> OpenedStep | None:
    """The step's Rollout request, as the trainer's step opens it (at the current weight version)."""
    return trainer.assembly.open(step, trainer.weights.version)


def _save_due(trainer: Trainer) -> bool:
    """Whether the step just opened writes a checkpoint, as the trainer's step asks it."""
    return trainer.checkpoints.save_due(trainer.steps_done, trainer.prompts.data_ends())


def _ids(trainer: Trainer, steps: range) -> list[list[list[int]]]:
    out = []
    for step in steps:
        taken = _request(trainer, step)
        assert taken is not None
        out.append([p.token_ids for p in taken.request.prompts])
    return out


def test_resume_from_a_checkpoint_asks_for_the_same_prompts_mid_epoch(tmp_path, tiny_model_dir) -> None:
    spec = _spec(_dataset(tmp_path))
    straight = _trainer(tmp_path, tiny_model_dir, spec)
    first = _ids(straight, range(5))  # 20 of 30 rows: the checkpoint below is mid-epoch
    later = _ids(straight, range(5, 12))  # ...and the run goes on across the epoch's end
    assert straight.prompts.cursor.epoch == 1

    again = _trainer(tmp_path, tiny_model_dir, spec)
    _ids(again, range(5))
    ckpt = tmp_path / "ckpt" / tag_of(5)
    ckpt.mkdir(parents=True)
    (ckpt / "model.bin").write_bytes(b"stand-in")
    write_manifest(ckpt, again.checkpoint_state(5, 5, "sum"))
    assert json.loads((ckpt / "manifest.json").read_text())["state"]["data_cursor"] == {"epoch": 0, "position": 20}

    resumed = _trainer(tmp_path, tiny_model_dir, spec, checkpoints=tmp_path / "ckpt")
    assert resumed._resume_point() == ckpt and resumed.steps_done == 5
    assert _ids(resumed, range(5, 12)) == later
    assert first[0] != later[0]

    (tmp_path / "other").mkdir()
    changed = _spec(_dataset(tmp_path / "other", n=31))
    with pytest.raises(CheckpointError, match="task.dataset.train of 30 rows, this job's has 31"):
        _trainer(tmp_path, tiny_model_dir, changed, checkpoints=tmp_path / "ckpt")._resume_point()


def test_prompts_go_through_the_chat_template_with_the_system_prompt(tmp_path, tiny_model_dir) -> None:
    from rlboost.models import encode_prompt

    trainer = _trainer(tmp_path, tiny_model_dir, _spec(_dataset(tmp_path), shuffle=False))
    opened = _request(trainer, 0)
    assert opened is not None
    request, examples, skipped = opened.request, trainer.assembly.examples, opened.skipped
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 0+1?"}]
    assert request.prompts[0].token_ids == encode_prompt(trainer.vocab.tokenizer, messages) and skipped == 0
    assert examples[0].metadata == {"id": 0} and examples[0].answer == "1"
    record = json.loads((tmp_path / "run" / "chat_template.json").read_text())
    assert record["template"] == trainer.vocab.tokenizer.chat_template and record["system_prompt"] == "Be brief."


def test_the_last_epoch_ends_training_with_a_checkpoint(tmp_path, tiny_model_dir) -> None:
    trainer = _trainer(tmp_path, tiny_model_dir, _spec(_dataset(tmp_path, n=10), epochs=1), tmp_path / "ckpt")
    trainer.checkpoints.resume = False
    assert _request(trainer, 0) is not None and not _save_due(trainer)
    assert _request(trainer, 1) is not None and _save_due(trainer)  # 8 of 10 rows: the next batch cannot fill
    assert _request(trainer, 2) is None


def test_bad_datasets_are_refused_before_the_first_step(tmp_path, tiny_model_dir) -> None:
    path = _dataset(tmp_path)
    with pytest.raises(DatasetError, match=r"longer than task\.dataset\.maxPromptTokens \(5"):
        _trainer(tmp_path, tiny_model_dir, _spec(path, maxPromptTokens=5))
    with pytest.raises(DatasetError, match=r"no column 'question' \(task\.dataset\.promptField\)"):
        _trainer(tmp_path, tiny_model_dir, _spec(path, promptField="question"))
    with pytest.raises(DatasetError, match=r"task\.dataset\.validation: .*does not exist"):
        _trainer(tmp_path, tiny_model_dir, _spec(path, validation=str(tmp_path / "missing.jsonl")))


def test_enable_thinking_reaches_templates_that_read_it(tiny_model_dir) -> None:
    from rlboost.models import encode_prompt, load_tokenizer
    from rlboost.models.tokenizer import chat_template_record

    tok = load_tokenizer(tiny_model_dir)
    assert not chat_template_record(tok, None, "")["reads_enable_thinking"]
    # Qwen3's template adds an empty think block when thinking is off; the same clause on the tiny template:
    tok.chat_template += (
        "{%- if enable_thinking is defined and not enable_thinking %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    )
    messages = [{"role": "user", "content": "What is 1+1?"}]
    off, default = encode_prompt(tok, messages, enable_thinking=False), encode_prompt(tok, messages)
    assert off[: len(default)] == default and len(off) > len(default) == len(encode_prompt(tok, messages, True))
    assert chat_template_record(tok, False, "")["reads_enable_thinking"]


def test_groups_in_flight_at_a_checkpoint_are_asked_for_again_on_resume(tmp_path, tiny_model_dir) -> None:
    """Partial rollout: the checkpoint records where each open group took its prompt; the resumed trainer's first
    request carries those groups (every sample owed) with the same prompts, and opens no new ones beyond the bound."""
    data = _spec(_dataset(tmp_path)).model_dump(by_alias=True)
    data["algorithm"].update(partialRollout=True, maxStaleness=1)
    spec = JobSpec.model_validate(data)
    trainer = _trainer(tmp_path, tiny_model_dir, spec)
    opened = _request(trainer, 0)
    assert opened is not None and len(trainer.assembly.carry) == len(opened.request.prompts) > 0
    ckpt = tmp_path / "ckpt" / tag_of(1)
    ckpt.mkdir(parents=True)
    (ckpt / "model.bin").write_bytes(b"stand-in")
    write_manifest(ckpt, trainer.checkpoint_state(1, 1, "sum"))

    resumed = _trainer(tmp_path, tiny_model_dir, spec, checkpoints=tmp_path / "ckpt")
    assert resumed._resume_point() == ckpt and resumed.assembly.carry.regenerated == len(opened.request.prompts)
    again = _request(resumed, 1)
    assert again is not None and again.request.prompts == []  # the bound of groups in flight is reached
    samples = list(range(spec.algorithm.group_size))
    assert [(c.step, c.prompt_index, c.prompt_ids, c.sample_indices) for c in again.request.carried] == [
        (0, p.prompt_index, p.token_ids, samples) for p in opened.request.prompts
    ]
