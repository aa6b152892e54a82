"""Trainer checkpoints: atomic, checksummed directories that a resumed run continues from bit-exactly.

Layout of `<checkpoint-dir>`:

    step-00000004/            one complete checkpoint (after 4 optimizer steps)
        <DeepSpeed files>     model + optimizer state (ZeRO partitions, one file per rank where partitioned)
        rng-rank<r>.pt        Python, NumPy and torch RNG states of rank r
        manifest.json         written LAST: trainer state + sha256 and size of every other file
    .incoming/                checkpoints being written (never read)

Writing: every rank saves into `.incoming/<tag>/` (DeepSpeed's collective save), a barrier, then rank 0
hashes the files, writes the manifest and renames the directory into place (atomic on one filesystem).
A checkpoint without a manifest, or whose files do not match it, is partial or corrupt: `latest_valid`
skips it (with a warning) and the previous one is used.

Trainer state in the manifest: `steps_done` (the next step), `data_cursor` (the prompt stream's (epoch, position)
after it: with the task seed it fixes every later batch, see rlboost.tasks.dataset), `weight_version` and `weights_checksum` of the published
weights the checkpoint holds, and the world size and ZeRO stage (a different world cannot load it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlboost.fsio import fsync_dir, writing

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
INCOMING = ".incoming"
FORMAT = 1
# What a checkpoint that could not be written names (rlboost.fsio.WriteFailed): where it goes and what frees space.
WHERE = "the trainer's --checkpoint-dir (on Kubernetes its volume) or trainer.keepCheckpoints"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says which and why."""


@dataclass
class TrainerState:
    """What the step loop needs to continue exactly where a checkpoint left off."""

    steps_done: int
    weight_version: int
    weights_checksum: str
    world_size: int
    zero_stage: int
    task_seed: int
    prompts_per_step: int
    data_cursor: dict[str, int] | None = None  # the prompt stream's Cursor after the step (None: older checkpoints)
    dataset_rows: int = 0  # rows of task.dataset.train when written (0: the built-in task); must match on resume
    # algorithm.partialRollout: where each group still in flight took its prompt (trainer.partial.GroupCarry)
    carried_groups: list[dict] | None = None
    # the StepReport of the step that ended here (JSON; its validation, done later, lies beside the checkpoint:
    # validation_file): published again on resume, since a trainer
    # killed between this checkpoint and the report's publication would otherwise leave that step unreported
    last_report: dict | None = None


def tag_of(steps_done: int) -> str:
    return f"step-{steps_done:08d}"


def reported_marker(checkpoint: Path) -> Path:
    """Beside a checkpoint (not in it: its manifest stays as written): present once its step's report went out."""
    return checkpoint.with_name(checkpoint.name + ".reported")


def validation_file(checkpoint: Path) -> Path:
    """Beside a checkpoint: its step's evaluation (the report's `validation`, JSON), written after the checkpoint
    (evaluation runs at the weights the step published), so that a report sent again on resume carries it."""
    return checkpoint.with_name(checkpoint.name + ".validation.json")


def remove_sidecars(checkpoint: Path) -> None:
    """What lies beside a checkpoint and belongs to it: gone with it, or when a new copy of it is written."""
    reported_marker(checkpoint).unlink(missing_ok=True)
    validation_file(checkpoint).unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def write_manifest(ckpt: Path, state: TrainerState) -> None:
    """Hash every file of `ckpt` and write the manifest (fsynced): the checkpoint's commit record."""
    files = {str(p.relative_to(ckpt)): {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in _files(ckpt)}
    body = {"format": FORMAT, "state": asdict(state), "files": files}
    tmp = ckpt / (MANIFEST + ".tmp")
    with tmp.open("w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(ckpt / MANIFEST)


def verify(ckpt: Path) -> TrainerState:
    """The trainer state of a complete, intact checkpoint, or CheckpointError saying what is wrong."""
    manifest = ckpt / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{ckpt}: no {MANIFEST} (partial checkpoint)")
    try:
        body = json.loads(manifest.read_text())
        state = TrainerState(**body["state"])
        files = body["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"{ckpt}: unreadable {MANIFEST} ({err})") from None
    if not files:
        raise CheckpointError(f"{ckpt}: {MANIFEST} lists no files")
    for rel, meta in files.items():
        p = ckpt / rel
        if not p.is_file():
            raise CheckpointError(f"{ckpt}: {rel} is missing")
        if p.stat().st_size != meta["bytes"] or _sha256(p) != meta["sha256"]:
            raise CheckpointError(f"{ckpt}: {rel} does not match its checksum (corrupt)")
    return state


def list_checkpoints(root: Path) -> list[Path]:
    """Complete-looking checkpoint directories, newest first (by step count)."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")), reverse=True)


def latest_valid(root: Path) -> tuple[Path, TrainerState] | None:
    """The newest intact checkpoint; corrupt or partial ones are skipped with a warning."""
    for ckpt in list_checkpoints(root):
        try:
            return ckpt, verify(ckpt)
        except CheckpointError as err:
            log.warning("skipping checkpoint", extra={"checkpoint": str(ckpt), "error": str(err)})
    return None


def prune(root: Path, keep: int) -> None:
    """Delete all but the newest `keep` valid checkpoints (invalid ones older than those go too)."""
    kept = 0
    for ckpt in list_checkpoints(root):
        if kept < keep:
            try:
                verify(ckpt)
                kept += 1
                continue
            except CheckpointError:
                pass  # a corrupt one never counts towards `keep`
        shutil.rmtree(ckpt, ignore_errors=True)
        remove_sidecars(ckpt)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save(engine: Any, root: Path, state: TrainerState, keep: int) -> Path:
    """Collective: every rank calls it. Writes `<root>/<tag>` atomically; returns its final path."""
    rank = int(os.environ.get("RANK", "0"))
    tag = tag_of(state.steps_done)
    incoming = root / INCOMING
    if rank == 0:
        shutil.rmtree(incoming / tag, ignore_errors=True)  # leftovers of a killed run
        incoming.mkdir(parents=True, exist_ok=True)
    _barrier()
    engine = getattr(engine, "engine", engine)  # a PolicyEngine or the DeepSpeed engine itself
    with _writing(incoming / tag):
        engine.save_checkpoint(str(incoming), tag=tag, client_state={"trainer": asdict(state)}, save_latest=False)
        torch.save(rng_state(), incoming / tag / f"rng-rank{rank}.pt")
    _barrier()
    final = root / tag
    if rank == 0:
        with _writing(incoming / tag):
            write_manifest(incoming / tag, state)
        if final.exists():
            shutil.rmtree(final)  # an older copy of the same step (a re-run after resume)
        remove_sidecars(final)  # this copy's report is not out yet, nor its evaluation done
        (incoming / tag).rename(final)
        fsync_dir(root)
        prune(root, keep)
        log.info("checkpoint written", extra={"checkpoint": str(final), "steps_done": state.steps_done})
    _barrier()
    return final


def _writing(partial: Path) -> contextlib.AbstractContextManager[None]:
    """A rank's part of a checkpoint: on a failed write (a full disk) nothing of it stays in .incoming/, and the
    error is one line naming the directory and the fields (rlboost.fsio.WriteFailed); the previous checkpoints
    are untouched, so a resumed run continues from the newest of them."""
    return writing(f"checkpoint {partial.name}", partial.parent.parent, WHERE, undo=lambda: shutil.rmtree(partial))


def load(engine: Any, ckpt: Path) -> None:
    """Collective: restore model, optimizer and this rank's RNG from a verified checkpoint directory."""
    rank = int(os.environ.get("RANK", "0"))
    engine = getattr(engine, "engine", engine)
    path, _ = engine.load_checkpoint(str(ckpt.parent), tag=ckpt.name, load_optimizer_states=True)
    if path is None:
        raise CheckpointError(f"{ckpt}: DeepSpeed could not load it")
    rng = ckpt / f"rng-rank{rank}.pt"
    if not rng.is_file():
        raise CheckpointError(f"{ckpt}: no RNG state for rank {rank} (written by a different world size?)")
    set_rng_state(torch.load(rng, weights_only=False))
