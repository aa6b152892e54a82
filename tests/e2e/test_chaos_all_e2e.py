"""End to end: any process of a job can die. One `rlboost local` run with chaos across every service.

`rlboost local --config examples/local-preemption.yaml --temperature 0` (greedy, a fixed seed, 160-token
responses, a checkpoint after every step, weights that change every step) is run uninterrupted once; then again with
`--chaos-kill-every 1 --chaos-step-seconds 2 --chaos-targets spot,manager,nats,weight-server,reserved,trainer`: the
roles take turns, and each kill lands on a process the manager's status shows at work (a worker streaming an
unfinished response; the weight-server, NATS and the trainer while a step rolls out), at most one per half step
of the job's progress (its finished samples), never by the wall clock: with a period in seconds, an idle machine
finished the 12 steps (0.6 s each) before the trainer's turn came. The runner replaces killed spot workers and
restarts every other killed process with the same ports and arguments (the trainer with --resume, from its last
checkpoint).

The chaos run must complete with every sample of every step, token for token equal to the uninterrupted run,
no token lost or regenerated, and the same final weights checksum; its report lists every fault injected.

The rollout-manager is among the targets: killed while tokens stream to it, restarted on its port; the workers
re-report their in-flight tokens and the trainer re-attaches its step (docs/preemption.md).

Run it alone with `.venv/bin/pytest -m slow tests/e2e/test_chaos_all_e2e.py` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_cli import run_local as run_local_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "local-preemption.yaml"
# Steps are short (about a second of rollout each); the run must outlast one turn of every role, and a restarted
# trainer needs 20-40 s to train again on 2 busy cores, and the manager comes back with its step re-attached:
# 12 steps leave a margin (8 did not once the manager joined the targets).
STEPS = 12
PROMPTS_PER_STEP, GROUP_SIZE = 4, 4  # as in the config
# Deadlines catch a hang, not slowness: under a load average of 18 on 2 cores the chaos run took over 300 s.
RUN_TIMEOUT_S = 420
# Chaos is paced by progress: a step's finished samples count 2 s of its 1 s period, so a kill at most every half
# step, on any machine. Six roles take about 3-5 steps (a worker or NATS coming back while the job goes on adds
# some), well inside the 12.
STEP_SECONDS = 2
# Turn order: the quick restarts first, the trainer (the slowest to train again: it resumes from its checkpoint)
# last; a trainer is only hit mid-step, so its turn always comes before the job ends.
TARGETS = ["spot", "manager", "nats", "weight-server", "reserved", "trainer"]
# A worker's turn waits until the manager shows it streaming an unfinished response. At the example's 48 tokens an
# AVX-512 EPYC ran a step's rollout in 0.2-0.3 s, each worker streaming (tokens flushed, response unfinished) for
# under 0.1 s of it, and chaos never once saw the reserved worker so in 7 steps: its turn never came (loaded run,
# 2026-11-24). At 160 a worker streams three times as long each step (as in test_preemption_e2e).
MAX_NEW_TOKENS = 160

Key = tuple[int, int, int]
COEFS = "  microBatchSize: 16\n  entropyCoef: 0.05\n  klCoef: 0.05\n"


def _config(out: Path) -> Path:
    """The preemption example with longer responses (MAX_NEW_TOKENS), a checkpoint after every step (a killed trainer redoes at most one step) and
    an entropy bonus and KL penalty, which change the weights every step even when all rewards tie: the final
    checksum then tells a run that trained on other samples, or resumed wrongly, from the uninterrupted one."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "job.yaml"
    extra, tokens = "\ntrainer: {checkpointEvery: 1}\nrollout:", f"  maxNewTokens: {MAX_NEW_TOKENS}\n"
    text = CONFIG.read_text().replace("\nrollout:", extra, 1).replace("  microBatchSize: 16\n", COEFS, 1)
    text = text.replace("  maxNewTokens: 48\n", tokens, 1)
    assert extra in text and COEFS in text and tokens in text, "examples/local-preemption.yaml changed: update _config"
    cfg.write_text(text)
    return cfg


def run_local(out: Path, *flags: str) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    """Run `rlboost local` greedily; its JSON report and the dumped rollouts keyed by (step, prompt, sample).

    A trainer killed mid-step and resumed from its checkpoint redoes the step; it first cuts the dump to the steps
    before it, so each sample is in the file once (issue 31: the audit found 256 duplicate rows after chaos)."""
    report, dump = out / "report.json", out / "rollouts.jsonl"
    run_local_cli(
        "--config",
        _config(out),
        "--steps",
        str(STEPS),
        "--temperature",
        "0",
        "--run-dir",
        out / "run",
        "--json-report",
        report,
        "--dump-rollouts",
        dump,
        *flags,
        timeout=RUN_TIMEOUT_S,
    )
    rollouts: dict[Key, dict[str, Any]] = {}
    for line in dump.read_text().splitlines():
        d = json.loads(line)
        key = (d["step"], d["prompt_index"], d["sample_index"])
        assert key not in rollouts, f"sample {key} dumped twice"
        rollouts[key] = d
    return json.loads(report.read_text()), rollouts


def all_samples() -> set[Key]:
    return {(s, p, g) for s in range(STEPS) for p in range(PROMPTS_PER_STEP) for g in range(GROUP_SIZE)}


def tokens_in_flight(doing: str) -> int:
    """`... 17 tokens in flight`: what the victim (or, for a service, all workers) held when it was hit."""
    match = re.search(r"(\d+) tokens in flight", doing)
    return int(match[1]) if match else 0


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)  # two runs
def test_every_service_killed_mid_work_loses_nothing(tmp_path: Path) -> None:
    expected_report, expected = run_local(tmp_path / "uninterrupted")
    assert expected_report["ok"] and expected_report["faults"] == [] and set(expected) == all_samples()
    assert len({s["weights_checksum"] for s in expected_report["steps"]}) == STEPS  # every step moved the weights

    report, rollouts = run_local(
        tmp_path / "chaos",
        "--chaos-kill-every",
        "1",
        "--chaos-step-seconds",
        str(STEP_SECONDS),
        "--chaos-targets",
        ",".join(TARGETS),
    )

    # The job completed with every sample, token for token the uninterrupted run's, and the same weights.
    assert report["ok"] and len(report["steps"]) == STEPS, report["error"]
    assert set(rollouts) == all_samples(), f"missing {sorted(all_samples() - set(rollouts))[:5]}"
    differ = [k for k in expected if rollouts[k]["token_ids"] != expected[k]["token_ids"]]
    assert differ == [], f"{len(differ)} samples differ from the uninterrupted run, e.g. {differ[:3]}"
    assert report["tokens_lost"] == 0 and report["tokens_regenerated"] == 0
    assert report["final_weights_checksum"] == expected_report["final_weights_checksum"]

    # Every role was hit at least once, each caught at work; every restarted process came back (but the last
    # one may still be starting when the job ends: nothing waits for it).
    faults = report["faults"]
    assert {f["role"] for f in faults} == set(TARGETS), faults
    for fault in faults:
        assert fault["signal"] == "SIGKILL" and fault["doing"], fault
        if fault["role"] in ("spot", "reserved", "manager"):
            assert tokens_in_flight(fault["doing"]) > 0, fault  # a response was streaming
    unfinished = [f for f in faults[:-1] if f["role"] != "spot" and f["back_after_seconds"] is None]
    assert unfinished == [], f"never came back: {unfinished}"
