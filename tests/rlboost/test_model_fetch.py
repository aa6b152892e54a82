"""rlboost.models.sources, .fetch and .layout for real: the tiny model created, 'path' and 'pvc' directories
checked, and the command line's one-line errors, exit codes and termination log (run as a process).
Object storage and the Hub have their own files (test_model_fetch_s3.py, test_model_fetch_hf.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlboost.models import ModelError, ensure_model
from rlboost.models.errors import EXIT_BAD_SOURCE, EXIT_USAGE, ModelFetchError
from rlboost.models.fetch import main
from rlboost.models.layout import asset_files, model_dir_problem
from rlboost.models.sources import fetch_model
from rlboost.spec import JobSpec, ModelSpec, TaskSpec

SMALL = {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "warmupSteps": 0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = ModelSpec.model_validate(SMALL)
    return ensure_model(spec, TaskSpec(), tmp_path_factory.mktemp("fetch") / "model")


def _spec(**model: object) -> JobSpec:
    return JobSpec.model_validate({"model": {**SMALL, **model}})


def _copy(model_dir: Path, dest: Path) -> Path:
    shutil.copytree(model_dir, dest)
    return dest


def test_tiny_is_created_in_dest(tmp_path: Path) -> None:
    dest = fetch_model(_spec(source="tiny"), tmp_path / "models" / "policy")
    assert dest == tmp_path / "models" / "policy" and model_dir_problem(dest) == ""
    assert [p.name for p in dest.parent.iterdir()] == ["policy"]  # no temporary sibling left behind


def test_layout_names_assets_and_accepts_a_saved_model(model_dir: Path) -> None:
    assert model_dir_problem(model_dir) == ""
    names = [p.name for p in asset_files(model_dir)]
    assert "config.json" in names and "tokenizer.json" in names and "chat_template.jinja" in names
    assert not any(n.endswith(".safetensors") for n in names)


def test_path_and_pvc_directories_are_checked_not_copied(model_dir: Path, tmp_path: Path) -> None:
    assert fetch_model(_spec(source="path", path=str(model_dir)), tmp_path / "unused") == model_dir
    assert not (tmp_path / "unused").exists()
    claim = _copy(model_dir, tmp_path / "claim" / "qwen")
    assert fetch_model(_spec(source="pvc", claimName="models", path="qwen"), claim) == claim


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda d: shutil.rmtree(d), "NotFound: "),
        (lambda d: (d / "config.json").unlink(), "holds no config.json"),
        (lambda d: (d / "tokenizer.json").unlink(), "holds no tokenizer"),
        (lambda d: [p.unlink() for p in d.glob("*.safetensors")], "holds no *.safetensors"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\xff" * 64), "not a safetensors file"),
        (lambda d: (d / "config.json").write_text("{}"), "has no model_type"),
    ],
)
def test_a_pvc_directory_that_is_no_model_names_the_field(model_dir: Path, tmp_path: Path, damage, expected) -> None:
    claim = _copy(model_dir, tmp_path / "claim")
    damage(claim)
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec(source="pvc", claimName="models", path="qwen"), claim)
    assert str(info.value).startswith("spec.model.path: ") and expected in str(info.value)
    assert info.value.exit_code == EXIT_BAD_SOURCE
    with pytest.raises(ModelFetchError) as info:  # the claim's root: the claim is at fault
        fetch_model(_spec(source="pvc", claimName="models"), claim)
    assert str(info.value).startswith("spec.model.claimName: ") and "claim 'models'" in str(info.value)


def test_a_shard_index_naming_a_missing_shard_is_refused(model_dir: Path, tmp_path: Path) -> None:
    d = _copy(model_dir, tmp_path / "m")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00002.safetensors"}}))
    assert "model-00002.safetensors" in model_dir_problem(d)


def test_ensure_model_refuses_pvc_outside_kubernetes(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="only a Kubernetes job mounts"):
        ensure_model(ModelSpec(source="pvc", claim_name="m"), TaskSpec(), tmp_path / "m")


def _run(tmp_path: Path, model: dict, dest: Path, *extra: str) -> subprocess.CompletedProcess:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"model": model}))
    argv = [sys.executable, "-m", "rlboost.models.fetch", "--config", str(job), "--dest", str(dest), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_command_line_writes_one_line_to_stderr_and_the_termination_log(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    done = _run(tmp_path, {"source": "pvc", "claimName": "models"}, tmp_path / "nothing", "--termination-log", str(log))
    assert done.returncode == EXIT_BAD_SOURCE
    line = log.read_text().strip()
    assert line.startswith("spec.model.claimName: NotFound: ") and "\n" not in line
    assert line in done.stderr and "Traceback" not in done.stderr


def test_command_line_checks_a_pvc_model_and_exits_0(model_dir: Path, tmp_path: Path) -> None:
    done = _run(tmp_path, {"source": "pvc", "claimName": "models"}, model_dir)
    assert done.returncode == 0, done.stderr
    assert f"model ready in {model_dir}" in done.stderr


def test_command_line_with_a_bad_spec_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    done = _run(tmp_path, {"source": "huggingface"}, tmp_path / "m", "--termination-log", str(log))
    assert done.returncode == EXIT_USAGE
    assert "model.repo: model.source 'huggingface' needs model.repo" in log.read_text()


def test_command_line_with_a_bad_flag_is_one_line_and_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["--config", "", "--dest", str(tmp_path / "m")]) == EXIT_USAGE
    stderr = capsys.readouterr().err.strip().splitlines()
    assert len(stderr) == 1 and stderr[0].startswith("rlboost-fetch-model: --config: ")
