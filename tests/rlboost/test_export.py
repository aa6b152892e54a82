"""rlboost.export: the trained policy as a Hugging Face model directory that transformers loads and generates
from, written in place (a directory) or under an fsspec URI (fsspec's in-memory filesystem stands in for an
object store: the same put_file calls s3fs and gcsfs answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlboost.export import ExportError, export_model, resolve_export_path
from rlboost.models import encode_prompt, ensure_model, load_tokenizer, stop_token_ids
from rlboost.spec import JobSpec


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    spec = JobSpec()
    return ensure_model(spec.model, spec.task, tmp_path_factory.mktemp("export-model") / "model")


def _bf16_state(model_dir: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    state: dict = {}
    for shard in model_dir.glob("*.safetensors"):
        state |= {k: v.to(torch.bfloat16) for k, v in load_file(shard).items()}
    return state


def test_export_loads_in_transformers_and_generates(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    state = _bf16_state(tiny_model)
    stop = stop_token_ids(load_tokenizer(tiny_model))
    dest = export_model(state, tiny_model, str(tmp_path / "out" / "policy"), stop_ids=stop, pad_id=0)
    out = Path(dest)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"} <= names
    assert json.loads((out / "config.json").read_text()).get("dtype", "bfloat16") == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert model.dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        if name in state:
            assert torch.equal(tensor, state[name]), name
    tok = load_tokenizer(out)
    ids = torch.tensor([encode_prompt(tok, [{"role": "user", "content": "What is 2 + 3?"}])])
    generated = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids.shape[1]
    assert GenerationConfig.from_pretrained(out).eos_token_id in (stop[0], stop)


def test_export_again_replaces_the_previous_one(tiny_model, tmp_path):
    state = _bf16_state(tiny_model)
    dest = tmp_path / "policy"
    export_model(state, tiny_model, str(dest))
    (dest / "stale.txt").write_text("from the first export")
    export_model(state, tiny_model, str(dest))
    assert not (dest / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"]  # no staging or old directory left


def test_export_to_a_uri_puts_every_file_under_the_prefix(tiny_model):
    import fsspec

    state = _bf16_state(tiny_model)
    export_model(state, tiny_model, "memory://bucket/run-1")
    fs = fsspec.filesystem("memory")
    names = {p.rsplit("/", 1)[-1] for p in fs.ls("/bucket/run-1", detail=False)}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names


def test_unwritable_export_path_names_the_field(tiny_model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ExportError, match=r"export.path .*cannot create"):
        export_model(_bf16_state(tiny_model), tiny_model, str(blocker / "policy"))


def test_relative_export_paths_are_under_the_run_dir(tmp_path):
    assert resolve_export_path("out/policy", tmp_path) == str((tmp_path / "out" / "policy").resolve())
    assert resolve_export_path("/abs/policy", tmp_path) == "/abs/policy"
    assert resolve_export_path("s3://b/p", tmp_path) == "s3://b/p"


def test_an_export_to_a_full_disk_is_one_line_naming_export_path_and_leaves_nothing(tiny_model):
    """Issue 31: export.path on a real 1 MiB tmpfs (tests/small_fs.py), too small for the model."""
    from rlboost.fsio import WriteFailed
    from tests.small_fs import mounted_tmpfs

    state = _bf16_state(tiny_model)
    with mounted_tmpfs("256k") as root:
        dest = root / "out" / "policy"
        with pytest.raises(WriteFailed) as info:
            export_model(state, tiny_model, str(dest))
        message = str(info.value)
        assert message.startswith(f"policy export could not be written to {dest}: no space left on device")
        assert "export.path" in message and "\n" not in message
        assert list((root / "out").iterdir()) == []  # no staged directory, no half a model
