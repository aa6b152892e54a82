"""`python -m trainer` rejects bad input with one clear line (before torch or DeepSpeed load)."""

from __future__ import annotations

import os
import subprocess
import sys


def run_trainer(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=60, env=os.environ
    )


def test_missing_model_dir_is_one_line_naming_the_flag(tmp_path):
    res = run_trainer("--model-dir", str(tmp_path / "nope"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"rlboost serve trainer: --model-dir {str(tmp_path / 'nope')!r}: not a model directory "
        "(needs config.json + safetensors)"
    ]


def test_bad_config_names_the_field(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("algorithm:\n  groupSize: 1\n")
    res = run_trainer("--config", str(cfg))
    assert res.returncode == 2
    assert "algorithm.groupSize" in res.stderr and "Traceback" not in res.stderr


def test_unreadable_token_file_is_reported(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    res = run_trainer("--model-dir", str(tmp_path), "--token-file", str(tmp_path / "missing-token"))
    assert res.returncode == 2
    assert "--token-file" in res.stderr and "cannot read it" in res.stderr and "Traceback" not in res.stderr


def test_colocated_with_credentials_lacking_the_colocation_key_is_one_line_naming_it(tmp_path):
    """The trainer checks colocation acks with the job's colocation.key: a directory made before that item
    existed (and never upgraded) fails the start, not the first colocation wait."""
    from rlboost.auth.credentials import COLOCATION_KEY, generate

    creds = generate(tmp_path / "credentials")
    (creds.directory / COLOCATION_KEY).unlink()
    (tmp_path / "config.json").write_text("{}")
    cfg = tmp_path / "job.yaml"
    cfg.write_text("trainer:\n  colocateReserved: true\nrollout:\n  reserved: {replicas: 1}\n")
    res = run_trainer("--config", str(cfg), "--model-dir", str(tmp_path), "--credentials-dir", str(creds.directory))
    assert res.returncode == 1 and COLOCATION_KEY in res.stderr and "Traceback" not in res.stderr, res.stderr
