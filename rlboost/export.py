"""Export of the trained policy (`spec.export`) as a Hugging Face model directory, loadable as is by
`transformers.AutoModelForCausalLM.from_pretrained` and by SGLang:

    export_model(state, model_dir, "s3://bucket/run-1", stop_ids=[...])   # or a local directory

It holds the weights as safetensors (sharded past 5 GB, with the index transformers reads), the model
directory's config.json (its dtype set to the weights'), tokenizer files and chat template
(rlboost.models.layout's assets) and a generation_config.json (the model's own, else one naming the
tokenizer's stop tokens). The directory is written beside its destination and renamed into place, so a
reader never sees half of it; an object-store destination (fsspec: s3fs, gcsfs) gets the files one by one,
config.json last.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlboost.fsio import writing
from rlboost.models.layout import asset_files, model_dir_problem

log = logging.getLogger(__name__)

MAX_SHARD_SIZE = "5GB"  # the Hub's default shard size
GENERATION_CONFIG = "generation_config.json"


class ExportError(RuntimeError):
    """An export that could not be written; the message names spec.export.path."""


def resolve_export_path(path: str, run_dir: Path) -> str:
    """`export.path` as the trainer writes it: a URI as is, a relative directory under the run directory."""
    if "://" in path:
        return path
    local = Path(path).expanduser()
    return str(local if local.is_absolute() else (run_dir / local).resolve())


def check_export_path(dest: str) -> None:
    """Before the first step: the destination's directory can be created, or its URI scheme's filesystem is
    installed (an ExportError naming export.path otherwise)."""
    if "://" not in dest:
        _make_dir(Path(dest).parent, dest)
        return
    from rlboost.models.errors import ModelFetchError
    from rlboost.models.sources import filesystem

    try:
        filesystem(dest)
    except ModelFetchError as err:
        raise ExportError(f"export.path {dest!r}: {err.detail}") from None


def export_model(
    state: Mapping[str, Any], model_dir: Path, dest: str, stop_ids: Sequence[int] = (), pad_id: int | None = None
) -> str:
    """Write `state` (HF parameter names -> CPU tensors) with `model_dir`'s assets as a model directory at
    `dest` (a directory or an fsspec URI); returns `dest`."""
    parent = Path(dest).parent if "://" not in dest else None
    if parent is not None:
        _make_dir(parent, dest)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=parent) as tmp:
        staged = Path(tmp) / "model"
        with writing("policy export", dest if parent is not None else tmp, "export.path"):  # a full disk: one line
            staged.mkdir()
            _write(state, model_dir, staged, stop_ids, pad_id)  # the temporary directory goes with it
        problem = model_dir_problem(staged)
        if problem:
            raise ExportError(f"export.path {dest!r}: the exported directory is not a usable model ({problem})")
        if parent is not None:
            _replace_dir(staged, Path(dest))
        else:
            _upload(staged, dest)
    log.info("policy exported", extra={"export_path": dest, "tensors": len(state)})
    return dest


def _write(state: Mapping[str, Any], model_dir: Path, out: Path, stop_ids: Sequence[int], pad_id: int | None) -> None:
    from huggingface_hub import save_torch_state_dict

    save_torch_state_dict(dict(state), out, max_shard_size=MAX_SHARD_SIZE)
    for asset in asset_files(model_dir):
        shutil.copy2(asset, out / asset.name)
    dtype = _dtype_name(state)
    config = json.loads((out / "config.json").read_text())
    for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["torch_dtype"]:
        config[key] = dtype  # what from_pretrained(dtype="auto") and SGLang pick: the weights' own dtype
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if not (out / GENERATION_CONFIG).exists():
        (out / GENERATION_CONFIG).write_text(json.dumps(_generation_config(config, stop_ids, pad_id), indent=2) + "\n")


def _dtype_name(state: Mapping[str, Any]) -> str:
    first = next(iter(state.values()), None)
    return str(first.dtype).removeprefix("torch.") if first is not None else "float32"


def _generation_config(config: Mapping[str, Any], stop_ids: Sequence[int], pad_id: int | None) -> dict[str, Any]:
    """The model's generation defaults: its stop tokens (as the rollout workers stop), greedy otherwise."""
    out: dict[str, Any] = {"bos_token_id": config.get("bos_token_id")}
    eos = list(stop_ids) or config.get("eos_token_id")
    out["eos_token_id"] = eos[0] if isinstance(eos, list) and len(eos) == 1 else eos
    out["pad_token_id"] = pad_id if pad_id is not None else config.get("pad_token_id")
    return {k: v for k, v in out.items() if v is not None}


def _make_dir(path: Path, dest: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ExportError(f"export.path {dest!r}: cannot create {path} ({err.strerror or err})") from None


def _replace_dir(staged: Path, dest: Path) -> None:
    """Rename `staged` to `dest`; a previous export there is moved aside first and removed after."""
    old = dest.with_name(f".{dest.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    staged.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def _upload(staged: Path, uri: str) -> None:
    """Copy the files under the URI's prefix; config.json last, so a reader that sees it sees the rest."""
    from rlboost.models.sources import filesystem

    fs, root = filesystem(uri)
    files = sorted(staged.iterdir(), key=lambda p: (p.name == "config.json", p.name))
    try:
        for path in files:
            fs.put_file(str(path), f"{root.rstrip('/')}/{path.name}")
    except Exception as err:  # noqa: BLE001 (any object-store error: one line naming the field)
        raise ExportError(f"export.path {uri!r}: upload failed ({type(err).__name__}: {err})") from None
