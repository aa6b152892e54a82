"""End to end: `rlboost local` supervises its services as a kubelet does (issue 31 item 1).

No `--chaos`: the faults come from outside the runner, as the OOM killer or an operator would send them. One real
run of the chaos test's job (examples/local-preemption.yaml, greedy, 12 steps, a checkpoint after every step) is
started in the background; once it trains, each service is SIGKILLed in turn by its pid (the weight-server, NATS,
the rollout-manager, the reserved worker, a spot worker, the trainer), each kill waiting for the event that the
job went on after the previous one (a new step in the trainer's steps.jsonl and the victim running again).

The job must complete with every sample exactly once in the --dump-rollouts file, token for token the
uninterrupted run's, and the same final weights checksum; its report counts a restart per kill, each back.

Run it alone with `.venv/bin/pytest -m slow tests/e2e/test_supervision_e2e.py` (about 4 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.local_cli import finish_local, service_pids, start_local
from tests.e2e.test_chaos_all_e2e import RUN_TIMEOUT_S, STEPS, _config, all_samples
from tests.e2e.test_chaos_all_e2e import run_local as run_uninterrupted
from tests.helpers import wait_until

# The quick restarts first; the trainer (it resumes from its checkpoint, 20-40 s on 2 busy cores) last.
VICTIMS = ["weight-server", "nats", "rollout-manager", "reserved-0", "spot-0", "trainer"]
EVENT_TIMEOUT_S = 180  # a hang, not slowness: a resumed trainer under a load of 12 took about 60 s


def _steps_done(run_dir: Path) -> set[int]:
    """Steps the trainer reported so far (a resumed trainer may report one again)."""
    path = run_dir / "steps.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return {json.loads(line)["step"] for line in lines if line.endswith("}")}


def _kill_and_wait(proc: subprocess.Popen, run_dir: Path, victim: str) -> None:
    """SIGKILL `victim` (from outside the runner), then wait until it runs again and the job made a step since."""
    before = service_pids(proc.pid)
    assert victim in before, f"{victim} not running: {sorted(before)}"
    steps = _steps_done(run_dir)
    os.kill(before[victim], signal.SIGKILL)

    def back_and_going_on() -> bool:
        assert proc.poll() is None, f"rlboost local exited ({proc.returncode}) after {victim} was killed"
        pid = service_pids(proc.pid).get(victim)
        return pid is not None and pid != before[victim] and len(_steps_done(run_dir)) > len(steps)

    wait_until(back_and_going_on, EVENT_TIMEOUT_S, interval=0.5, what=f"{victim} back and a step made")


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 6 * EVENT_TIMEOUT_S)
def test_each_service_sigkilled_from_outside_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    expected_report, expected = run_uninterrupted(tmp_path / "uninterrupted")
    assert expected_report["ok"] and expected_report["restarts"] == [] and set(expected) == all_samples()

    out = tmp_path / "killed"
    run_dir, report, dump = out / "run", out / "report.json", out / "rollouts.jsonl"
    args = ["--config", _config(out), "--steps", str(STEPS), "--temperature", "0", "--run-dir", run_dir]
    args += ["--json-report", report, "--dump-rollouts", dump]
    proc = start_local(*args)
    try:
        wait_until(lambda: proc.poll() is None and _steps_done(run_dir), EVENT_TIMEOUT_S, 0.5, "training")
        for victim in VICTIMS:
            _kill_and_wait(proc, run_dir, victim)
    finally:
        finish_local(proc, *args, timeout=RUN_TIMEOUT_S)

    got = json.loads(report.read_text())
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    keys = Counter((r["step"], r["prompt_index"], r["sample_index"]) for r in rows)
    assert set(keys) == all_samples() and max(keys.values()) == 1, keys.most_common(3)  # each sample once
    tokens = {(r["step"], r["prompt_index"], r["sample_index"]): r["token_ids"] for r in rows}
    differ = [k for k in expected if tokens[k] != expected[k]["token_ids"]]
    assert differ == [], f"{len(differ)} samples differ from the uninterrupted run, e.g. {differ[:3]}"
    assert got["ok"] and len(got["steps"]) == STEPS, got["error"]
    assert got["final_weights_checksum"] == expected_report["final_weights_checksum"]
    assert got["tokens_lost"] == 0

    restarts = {r["process"]: r for r in got["restarts"]}
    assert sorted(restarts) == sorted(VICTIMS), got["restarts"]
    for r in restarts.values():
        assert r["cause"] == "died" and r["ended"] == "SIGKILL" and r["back_after_seconds"] is not None, r
