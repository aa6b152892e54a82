"""End to end: rollout on preemptible workers with every real service as a separate process on 127.0.0.1.

`rlboost local --config examples/local-preemption.yaml --temperature 0` (greedy, a fixed seed) is run
uninterrupted once; then again with spot workers preempted mid-response by the real CLI:
  * SIGKILL (chaos waits until the manager's status shows its victim running requests),
  * SIGTERM (the worker announces the drain, flushes every token, exits),
  * a Bamboo spot trace replayed time-scaled (workers beyond the trace's count get SIGKILL).
Each preempted run must deliver every sample of every step, token for token equal to the uninterrupted
run, with tokens_lost == tokens_regenerated == 0 and every received token in a response exactly once.

Run them with `.venv/bin/pytest -m slow tests/e2e/test_preemption_e2e.py` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_cli import run_local as run_local_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "local-preemption.yaml"
TRACE = REPO / "traces" / "bamboo" / "aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv"
STEPS = 3
PROMPTS_PER_STEP, GROUP_SIZE = 4, 4  # as in the config
RUN_TIMEOUT_S = 240

Key = tuple[int, int, int]


def run_local(out: Path, *flags: str, steps: int = STEPS) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    """Run `rlboost local` greedily; return its JSON report and the dumped rollouts keyed by (step, prompt, sample)."""
    report, dump = out / "report.json", out / "rollouts.jsonl"
    run_local_cli("--config", CONFIG, "--steps", str(steps), "--temperature", "0", "--run-dir", out / "run",
                  "--json-report", report, "--dump-rollouts", dump, *flags, timeout=RUN_TIMEOUT_S)  # fmt: skip
    rollouts: dict[Key, dict[str, Any]] = {}
    for line in dump.read_text().splitlines():
        d = json.loads(line)
        key = (d["step"], d["prompt_index"], d["sample_index"])
        assert key not in rollouts, f"sample {key} delivered twice"
        rollouts[key] = d
    return json.loads(report.read_text()), rollouts


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    report, rollouts = run_local(tmp_path_factory.mktemp("uninterrupted"))
    assert report["preemptions"] == 0
    return report, rollouts


def all_samples(steps: int) -> set[Key]:
    """(step, prompt, sample) of every sample the config asks for."""
    return {(s, p, g) for s in range(steps) for p in range(PROMPTS_PER_STEP) for g in range(GROUP_SIZE)}


def assert_identical(rollouts: dict[Key, dict[str, Any]], expected: dict[Key, dict[str, Any]]) -> None:
    """Every sample of the expected steps is there, token for token and on the same weight version."""
    assert set(expected) == all_samples(STEPS)
    assert set(expected) <= set(rollouts), f"missing {sorted(set(expected) - set(rollouts))[:5]}"
    differ = [k for k in expected if rollouts[k]["token_ids"] != expected[k]["token_ids"]]
    assert differ == [], f"{len(differ)} samples differ from the uninterrupted run, e.g. {differ[:3]}"
    assert all(rollouts[k]["weight_version"] == expected[k]["weight_version"] for k in expected)


def assert_nothing_lost(report: dict[str, Any], rollouts: dict[Key, dict[str, Any]], steps: int = STEPS) -> None:
    """No sample is missing; the manager kept every token it received, each in exactly one delivered response."""
    assert report["ok"] and len(report["steps"]) == steps
    assert set(rollouts) == all_samples(steps), f"missing {sorted(all_samples(steps) - set(rollouts))[:5]}"
    assert report["tokens_lost"] == 0 and report["tokens_regenerated"] == 0
    assert report["tokens_received"] == sum(len(d["token_ids"]) for d in rollouts.values())
    assert report["tokens_received"] == sum(s["tokens"] for s in report["steps"])


def migrated(rollouts: dict[Key, dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in rollouts.values() if len(d["workers"]) >= 2]


@pytest.mark.slow
def test_sigkill_mid_response_gives_the_uninterrupted_greedy_rollouts(uninterrupted, tmp_path: Path) -> None:
    expected_report, expected = uninterrupted
    report, rollouts = run_local(tmp_path, "--chaos-kill-every", "2")
    assert_identical(rollouts, expected)
    assert_nothing_lost(report, rollouts)
    kills = [e for e in report["spot_events"] if e.startswith("SIGKILL")]
    assert report["preemptions"] == len(kills) > 0
    assert any("running)" in e and ", 0 running" not in e for e in kills), kills  # landed mid-response
    assert report["migrations_by_reason"].get("stream_broken", 0) > 0
    victims = {e.split()[1] for e in kills}
    assert any(d["workers"][0] in victims for d in migrated(rollouts)), "no killed worker's tokens were kept"
    # The training saw the same samples, so it ends on bit-identical weights.
    assert report["final_weights_checksum"] == expected_report["final_weights_checksum"]


@pytest.mark.slow
def test_sigterm_drain_flushes_every_token(uninterrupted, tmp_path: Path) -> None:
    _, expected = uninterrupted
    report, rollouts = run_local(tmp_path, "--chaos-kill-every", "2", "--chaos-signal", "TERM")
    assert_identical(rollouts, expected)
    assert_nothing_lost(report, rollouts)
    drained = {e.split()[1] for e in report["spot_events"] if e.startswith("SIGTERM") and ", 0 running" not in e}
    assert drained, report["spot_events"]
    assert report["migrations_by_reason"].get("drained", 0) > 0
    # A drained worker's flushed tokens start the response that another worker finished.
    handed_over = [d for d in migrated(rollouts) if d["workers"][0] in drained]
    assert handed_over, f"no response continued from a drained worker: {report['spot_events']}"


@pytest.mark.slow
def test_bamboo_trace_replay_loses_no_sample(uninterrupted, tmp_path: Path) -> None:
    _, expected = uninterrupted
    # Clamped to 0..2 spot workers this trace goes 0 -> 2 (108 s) -> 0 (299 s) -> 2 (652 s); 10x faster the
    # spot workers join during the first steps and are SIGKILLed at 30 s wall. Enough steps that the run
    # outlasts that on an idle machine too (8 steps once finished before it: no preemption to test).
    steps = 40
    report, rollouts = run_local(tmp_path, "--spot-trace", str(TRACE), "--trace-time-scale", "10", steps=steps)
    assert_identical(rollouts, expected)
    assert_nothing_lost(report, rollouts, steps)
    assert report["preemptions"] > 0, report["spot_events"]
    assert any(e.startswith("started spot-") for e in report["spot_events"])


def test_chaos_waits_for_a_busy_victim_then_loses_patience() -> None:
    """The chaos policy alone (pure): armed after a period, it kills a worker running requests, never one
    the manager does not know yet, and an idle registered one only after `patience_periods` periods."""
    from rlboost.local.chaos import ChaosMonkey

    monkey = ChaosMonkey(period_s=1.0, seed=0, patience_periods=3)
    monkey.start(0.0)
    assert not monkey.armed(0.5) and monkey.armed(1.0)
    assert monkey.choose(1.0, ["spot-0", "spot-1"], {}) is None  # none registered: wait
    assert monkey.choose(1.2, ["spot-0", "spot-1"], {"spot-0": 0, "spot-1": 3}) == "spot-1"
    assert monkey.choose(1.5, ["spot-0"], {"spot-0": 0}) is None  # idle: wait (patience starts)
    assert monkey.choose(4.5, ["spot-0"], {"spot-0": 0}) == "spot-0"
    assert monkey.choose(1.0, ["spot-0"], None) == "spot-0"  # no status: any live worker
    monkey.fire(5.0)
    assert not monkey.armed(5.9) and monkey.armed(6.0)


def test_chaos_prefers_a_victim_whose_tokens_are_flowing() -> None:
    """With token counts from the manager's status, a busy worker is a victim only once its count grew between two
    statuses (tokens streamed, so a kill has some to keep); a busy but silent one only after the patience."""
    from rlboost.local.chaos import ChaosMonkey

    monkey = ChaosMonkey(period_s=1.0, seed=0, patience_periods=3)
    monkey.start(0.0)
    busy = {"spot-0": 2, "spot-1": 2}
    assert monkey.choose(1.0, ["spot-0", "spot-1"], busy, {"spot-0": 10, "spot-1": 5}) is None  # first look
    assert monkey.choose(1.1, ["spot-0", "spot-1"], busy, {"spot-0": 10, "spot-1": 9}) == "spot-1"
    monkey.fire(1.1)
    assert monkey.choose(2.1, ["spot-0"], {"spot-0": 2}, {"spot-0": 10}) is None  # fresh window: first look
    assert monkey.choose(2.2, ["spot-0"], {"spot-0": 2}, {"spot-0": 10}) is None  # busy but silent: wait
    assert monkey.choose(5.2, ["spot-0"], {"spot-0": 2}, {"spot-0": 10}) == "spot-0"  # patience spent
