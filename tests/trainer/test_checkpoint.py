"""Checkpoints of the real DeepSpeed engine (gloo, one rank, CPU): bit-exact round trip, corrupt ones skipped."""

from __future__ import annotations

import json

import pytest
import torch

from tests.trainer.conftest import tiny_spec
from tests.trainer.test_engine import _batch
from trainer import checkpoint
from trainer.checkpoint import TrainerState, latest_valid, list_checkpoints, verify
from trainer.engine import PolicyEngine

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.distributed.:FutureWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # torch.load inside DeepSpeed's checkpoint loader
]


def _state(steps: int) -> TrainerState:
    return TrainerState(steps, steps, f"c{steps}", world_size=1, zero_stage=2, task_seed=1, prompts_per_step=2)


def _train_step(engine: PolicyEngine, batch, n: int) -> None:
    engine.forward_backward(batch, n)
    engine.step()


def test_round_trip_is_bit_exact_and_corrupt_checkpoints_fall_back(tiny_model_dir, tmp_path):
    spec = tiny_spec(learning_rate=5e-3, micro_batch_size=4)
    spec.trainer.zero_stage = 2
    root = tmp_path / "ckpt"
    a = PolicyEngine(tiny_model_dir, spec)
    batch, n = _batch(a)
    _train_step(a, batch, n)
    first = checkpoint.save(a, root, _state(1), keep=3)
    _train_step(a, batch, n)  # Adam moments from step 1 matter here: the optimizer state must round-trip
    want = a.full_state()
    checkpoint.save(a, root, _state(2), keep=3)

    b = PolicyEngine(tiny_model_dir, spec)  # fresh from the model directory: differs until loaded
    assert not all(torch.equal(b.full_state()[k], want[k]) for k in want)
    checkpoint.load(b, first)
    _train_step(b, batch, n)
    got = b.full_state()
    assert all(torch.equal(got[k].view(torch.int32), want[k].view(torch.int32)) for k in want)

    # The newest intact one is used; a flipped byte or a missing manifest makes the previous one current.
    assert [p.name for p in list_checkpoints(root)] == ["step-00000002", "step-00000001"]
    assert latest_valid(root)[1] == _state(2)
    newest = root / "step-00000002"
    victim = max((p for p in newest.rglob("*.pt")), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="does not match its checksum"):
        verify(newest)
    assert latest_valid(root) == (first, _state(1))
    (first / "manifest.json").unlink()  # a partial checkpoint: killed before its manifest was written
    assert latest_valid(root) is None
    assert not list((root / ".incoming").glob("step-*"))  # every written checkpoint was moved into place


def test_manifest_lists_every_file_with_its_hash(tiny_model_dir, tmp_path):
    spec = tiny_spec(micro_batch_size=4)
    spec.trainer.zero_stage = 1
    engine = PolicyEngine(tiny_model_dir, spec)
    saved = [checkpoint.save(engine, tmp_path, _state(s), keep=2) for s in (1, 2, 3)]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000002"]  # pruned to 2
    body = json.loads((saved[-1] / "manifest.json").read_text())
    on_disk = {str(p.relative_to(saved[-1])) for p in saved[-1].rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(body["files"]) == on_disk and "rng-rank0.pt" in on_disk
    assert body["state"]["steps_done"] == 3


def test_a_checkpoint_that_does_not_fit_leaves_nothing_and_the_previous_one_stays_current(tiny_model_dir, tmp_path):
    """Issue 31: the checkpoint directory on a real tmpfs that holds one checkpoint and a half. The second save
    fails with one line naming the directory and the fields, leaves nothing in .incoming/, and the first stays the
    newest valid one, loadable bit-exactly."""
    from rlboost.fsio import WriteFailed
    from tests.small_fs import mounted_tmpfs

    spec = tiny_spec(micro_batch_size=4)
    spec.trainer.zero_stage = 1
    engine = PolicyEngine(tiny_model_dir, spec)
    probe = checkpoint.save(engine, tmp_path / "probe", _state(1), keep=3)
    size = sum(p.stat().st_size for p in probe.rglob("*") if p.is_file())
    want = engine.full_state()
    with mounted_tmpfs(f"{size * 3 // 2 // 1024}k") as root:
        first = checkpoint.save(engine, root, _state(1), keep=3)
        with pytest.raises(WriteFailed) as info:
            checkpoint.save(engine, root, _state(2), keep=3)
        message = str(info.value)
        assert message.startswith(f"checkpoint step-00000002 could not be written to {root}: no space left on device")
        assert "--checkpoint-dir" in message and "trainer.keepCheckpoints" in message and "\n" not in message
        assert list((root / ".incoming").glob("step-*")) == []  # nothing partial left (DeepSpeed keeps its scripts)
        assert latest_valid(root) == (first, _state(1))
        fresh = PolicyEngine(tiny_model_dir, spec)
        checkpoint.load(fresh, first)
        got = fresh.full_state()
        assert all(torch.equal(got[k].view(torch.int32), want[k].view(torch.int32)) for k in want)
