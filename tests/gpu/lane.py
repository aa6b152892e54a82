"""The GPU lane's preemption run (tests/gpu/test_gpu_e2e.py), also run on CPU by tests/bench/test_preemption_bench.py
so that nothing of it is first exercised on a lent GPU: bench/preemption_bench.py on `--device`, one run per kind,
bounded per run and as a whole; its tables printed (the figures, tokens/s per worker), the invariants checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "preemption_bench.py"
LANE_S = 465  # the Makefile's bound on the whole of `make test-gpu` (8 minutes = 480 s)
KINDS, PREEMPTION_STEPS, RUN_TIMEOUT_S = ("notice", "silent", "expired"), 5, 85
MARGIN_S = 20  # pytest's start (torch's import) and end
_STARTED = time.monotonic()  # this module is imported while pytest collects the lane


RUN_TIMEOUT_MAX_S = 120  # what a run may take when the jobs before it left time over


def lane_left() -> float:
    """Seconds left of the lane's LANE_S for a test that starts now."""
    return LANE_S - MARGIN_S - (time.monotonic() - _STARTED)


def run_timeout_left(kinds: tuple[str, ...] = KINDS) -> float:
    """Each run's bound: the lane's time left shared by the runs (at least RUN_TIMEOUT_S when the learning job took its
    whole bound: tests/gpu/test_lane_budget.py), at most RUN_TIMEOUT_MAX_S."""
    return min(RUN_TIMEOUT_MAX_S, (lane_left() - bench_timeout(kinds, 0.0)) / len(kinds))


def bench_timeout(kinds: tuple[str, ...] = KINDS, run_timeout: float = RUN_TIMEOUT_S) -> float:
    """The bench as a whole: its runs, and its own start and tables."""
    return len(kinds) * run_timeout + 15


def bench_command(out: Path, device: str, kinds: tuple[str, ...], steps: int, run_timeout: float) -> list[str]:
    """The preemption bench as the lane runs it (tests/bench runs the same on CPU)."""
    return [
        sys.executable,
        str(BENCH),
        "--device",
        device,
        "--kinds",
        ",".join(kinds),
        "--steps",
        str(steps),
        "--max-new-tokens",
        "320" if device == "cuda" else "160",  # a CUDA worker decodes fast: longer responses, preempted mid-way
        "--run-timeout",
        str(run_timeout),
        "--out",
        str(out / "runs"),
        "--json",
        str(out / "preemption.json"),
    ]


def preemption_lane(
    out: Path,
    device: str,
    kinds: tuple[str, ...] = KINDS,
    steps: int = PREEMPTION_STEPS,
    run_timeout: float = RUN_TIMEOUT_S,
    extra: tuple[str, ...] = (),
) -> dict:
    """Run the bench on `device` (`extra`: more of its flags), print its tables (the figures, tokens/s per worker),
    check what every run must show (no token lost, the reserved worker's tokens/s, a preemption), return its JSON."""
    cmd = [*bench_command(out, device, kinds, steps, run_timeout), *extra]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=bench_timeout(kinds, run_timeout))
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"the preemption bench ran past {err.timeout:g} s: {' '.join(cmd)}") from None
    print(res.stdout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    figures = json.loads((out / "preemption.json").read_text())
    assert set(figures["summary"]) == set(kinds)
    for run in figures["runs"]:
        assert run["run_tokens_lost"] == 0, run["kind"]  # token-level migration keeps every streamed token
        assert run["tokens_per_s_per_worker"].get("reserved", 0) > 0, run["kind"]
    assert sum(s["preemptions"] for s in figures["summary"].values()) >= 1, "no preemption in any run"
    return figures


def tokens_per_worker(steps: list[dict]) -> dict[str, float]:
    """The bench's tokens/s per worker by pool, from a report's steps."""
    sys.path.insert(0, str(BENCH.parent))
    from preemption_bench import tokens_per_worker as per_worker

    return per_worker(steps)
