"""bench/preemption_bench.py on a tiny job: one `rlboost local` run per kind (SIGTERM notice, SIGKILL), three steps.

The JSON must carry the figures under the names the issue spells, per preemption and per kind, and a preemption
with notice must lose no token (the worker flushes everything before it exits). About a minute on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "preemption_bench.py"
KEYS = ("kind", "notice_to_drained_s", "tokens_in_flight", "tokens_kept", "tokens_lost", "tokens_regenerated")


def test_bad_kind_is_one_line() -> None:
    res = subprocess.run([sys.executable, BENCH, "--kinds", "polite"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--kinds 'polite': give a comma list of notice, silent, expired" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_bench_measures_notice_and_silent_preemptions(tmp_path: Path) -> None:
    out = tmp_path / "preemption.json"
    cmd = [
        sys.executable,
        BENCH,
        "--steps",
        "3",
        "--out",
        tmp_path / "runs",
        "--json",
        out,
        "--plot",
        tmp_path / "p.png",
    ]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["summary"]) == {"notice", "silent"}
    for kind, summary in figures["summary"].items():
        assert summary["preemptions"] >= 1, f"no {kind} preemption in 3 steps"
        assert {*KEYS, "resume_s", "first_token_s"} <= set(summary)
    runs = {run["kind"]: run for run in figures["runs"]}
    notices = [p for p in runs["notice"]["preemptions"] if p["kind"] == "notice"]
    assert notices and all(set(KEYS) <= set(p) for p in notices)
    assert all(p["tokens_lost"] == 0 == p["tokens_regenerated"] and p["notice_to_drained_s"] >= 0 for p in notices)
    assert all(p["tokens_kept"] == p["tokens_in_flight"] for p in notices)
    silent = [p for p in runs["silent"]["preemptions"] if p["kind"] == "silent"]
    assert silent and all(p["notice_to_drained_s"] is None and p["detected_after_s"] >= 0 for p in silent)
    resumed = [s for p in notices + silent for s in p["resume_s"]]
    assert resumed and all(s >= 0 for s in resumed)  # moved requests produced tokens again elsewhere
    assert all(0 <= step["share"] <= 1 for run in figures["runs"] for step in run["steps"])
    # the per-step figure is the product's (the step reports); the logs' recomputation over the manager's rollout
    # windows counts no stall the product misses (the product also counts stalls outside those windows)
    for summary in figures["summary"].values():
        assert summary["slot_s_lost"] >= summary["slot_s_lost_from_logs"] - 0.01, summary
    hit = [s for run in figures["runs"] for s in run["steps"] if s["preemptions"]]
    assert hit and all(s["slot_s"] > 0 for s in hit)
    assert (tmp_path / "p.png").stat().st_size > 10_000
