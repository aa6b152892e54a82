"""A trainer killed between a step's checkpoint and the publication of that step's report (the partial-rollout
chaos run in CI lost step 4's report so) publishes it again on resume: the checkpoint holds the report.

Real parts: a nats-server with the job's status stream (JetStream), read back by `rlboost local`'s own stream
reader; the checkpoint's TrainerState written and read by trainer.checkpoint's own code. The trainer is built but
not run (no model, manager or weight-server): the resume path's publication is called directly."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import nats

from rlboost.local.status_stream import ensure_status_stream, read_from
from rlboost.options.trainer import TrainerOptions
from rlboost.wire.events import StepReport, ValidationReport
from tests.trainer.conftest import tiny_spec
from trainer.checkpoint import TrainerState
from trainer.loop import Trainer


def _report(step: int) -> StepReport:
    return StepReport(
        step=step,
        weight_version=step + 1,
        weights_checksum="ab" * 32,
        reward_mean=0.5,
        tokens=96,
        rollout_seconds=1.0,
        train_seconds=0.2,
        sync_seconds=0.1,
    )


def test_the_checkpoint_state_keeps_the_report_and_older_checkpoints_have_none() -> None:
    state = TrainerState(
        steps_done=5,
        weight_version=5,
        weights_checksum="c",
        world_size=1,
        zero_stage=1,
        task_seed=0,
        prompts_per_step=4,
        last_report=_report(4).model_dump(mode="json"),
    )
    again = TrainerState(**json.loads(json.dumps(asdict(state))))  # as trainer.checkpoint stores and reads it
    assert StepReport.model_validate(again.last_report) == _report(4)
    older = {k: v for k, v in asdict(state).items() if k != "last_report"}
    assert TrainerState(**older).last_report is None


async def _resend(tmp_path: Path, model_dir: Path, nats_url: str, last_report: dict | None) -> list:
    """A trainer connected to NATS, with `last_report` as its checkpoints' resume point takes it, resends;
    what the job's status stream then holds, read as `rlboost local` reads it."""
    opts = TrainerOptions(
        manager="127.0.0.1:1",
        weight_server="http://127.0.0.1:1",
        model_dir=str(model_dir),
        run_dir=str(tmp_path / "run"),
        nats_url=nats_url,
        job="j",
    )
    trainer = Trainer(tiny_spec(), opts, token="t")
    reader = await nats.connect(nats_url)
    try:
        cursor = await ensure_status_stream(reader, "default", "j")
        await trainer.events.connect()
        trainer.checkpoints.last_report = last_report
        await trainer.checkpoints.resend_last_report(trainer.events)
        return await read_from(reader, cursor)
    finally:
        await reader.close()
        if trainer.events.nc is not None:
            await trainer.events.nc.close()


async def test_a_resumed_trainer_publishes_its_checkpoints_report_again(tmp_path: Path, tiny_model_dir, nats_server):
    got = await _resend(tmp_path, tiny_model_dir, nats_server.url, _report(4).model_dump(mode="json"))
    assert [(s.rsplit(".", 1)[-1], StepReport.model_validate_json(d)) for s, d in got] == [("steps", _report(4))]


async def test_a_fresh_trainer_or_a_marked_checkpoint_sends_nothing_again(tmp_path: Path, tiny_model_dir, nats_server):
    assert await _resend(tmp_path, tiny_model_dir, nats_server.url, None) == []


def test_a_checkpoint_whose_report_went_out_is_marked_beside_it(tmp_path: Path) -> None:
    """The mark is a file next to the checkpoint's directory (its manifest is untouched), named after it."""
    from trainer.checkpoint import reported_marker

    ckpt = tmp_path / "step-00000005"
    assert reported_marker(ckpt) == tmp_path / "step-00000005.reported"


def test_the_resent_report_carries_the_evaluation_written_beside_its_checkpoint(tmp_path: Path) -> None:
    """An evaluation step: the report is stored in the checkpoint before the evaluation runs, so the evaluation
    lies beside it and is merged back when resuming; a checkpoint without one (or a fresh trainer) is unchanged."""
    from rlboost.fsio import write_text_atomic
    from trainer.checkpoint import remove_sidecars, validation_file
    from trainer.resume import with_validation as _with_validation

    ckpt = tmp_path / "step-00000005"
    report = _report(4).model_dump(mode="json")
    assert _with_validation(report, ckpt) == report and _with_validation(None, ckpt) is None
    validation = ValidationReport(
        step=4, weight_version=5, reward_mean=0.75, pass_at_1=0.5, pass_at_k=0.75, k=2, prompts=4
    )
    write_text_atomic(validation_file(ckpt), validation.model_dump_json())
    resent = StepReport.model_validate(_with_validation(report, ckpt))
    assert resent.validation == validation and resent.model_copy(update={"validation": None}) == _report(4)
    remove_sidecars(ckpt)  # a new copy of the checkpoint, or its pruning
    assert not validation_file(ckpt).exists()
