"""The GPU lane's preemption run (tests/gpu/test_gpu_e2e.py), also run on CPU by tests/bench/test_preemption_bench.py
so that nothing of it is first exercised on a lent GPU: bench/preemption_bench.py on `--device`, one run per kind,
the runs bounded together (and each alone); its tables printed (the figures, tokens/s per worker), the invariants
checked.
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
KINDS, PREEMPTION_STEPS = ("notice", "silent", "expired"), 4
MARGIN_S = 20  # pytest's start (torch's import) and end
BENCH_OVERHEAD_S = 15  # the bench's own start and tables, beside its runs
# The runs share one bound (the bench's --timeout), since their lengths differ: on an H100 (2026-11-28) notice took
# 102 s, silent 48 s, expired 75 s. MIN_RUNS_S is what they get after a learning job that took its whole bound.
MIN_RUNS_S, RUN_TIMEOUT_S = 240, 200  # RUN_TIMEOUT_S: one run alone (a hung run stops there)
_STARTED = time.monotonic()  # this module is imported while pytest collects the lane


def lane_left() -> float:
    """Seconds left of the lane's LANE_S for a test that starts now."""
    return LANE_S - MARGIN_S - (time.monotonic() - _STARTED)


def runs_left() -> float:
    """What the preemption runs may take together if they start now: what is left of the lane, less the bench's own."""
    return lane_left() - BENCH_OVERHEAD_S


def bench_command(
    out: Path, device: str, kinds: tuple[str, ...], steps: int, runs_timeout: float, run_timeout: float = RUN_TIMEOUT_S
) -> list[str]:
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
        "160",  # preempted mid-way: on an H100 (2026-11-28) the torch engine decoded 320-token responses too slowly
        "--timeout",
        str(runs_timeout),
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
    runs_timeout: float = MIN_RUNS_S,
    extra: tuple[str, ...] = (),
) -> dict:
    """Run the bench on `device` (`extra`: more of its flags), print its tables (the figures, tokens/s per worker),
    check what every run must show (no token lost, the reserved worker's tokens/s, a preemption), return its JSON."""
    cmd = [*bench_command(out, device, kinds, steps, runs_timeout), *extra]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=runs_timeout + BENCH_OVERHEAD_S)
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
