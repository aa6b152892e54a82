"""Run `rlboost local` as a real subprocess for end-to-end tests: a deadline, and the output on failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_local(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m rlboost.cli.main local ARGS`; fails the test on a timeout or a non-zero exit."""
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", *map(str, args)]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"rlboost local {' '.join(args)} did not finish in {timeout:.0f} s:\n{err.stdout}\n{err.stderr}")
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res
