"""End to end: agentic episodes (examples/local-agent.yaml) with algorithm.partialRollout on and maxStaleness 1,
every service a real process (env-runners included), while chaos SIGKILLs a spot worker each time the manager's
status shows it streaming a model turn.

Checks: the run completes; every episode the trainer received is there once; the samples trained are exactly those
of the groups that completed (none lost, none trained twice); some episodes were carried into a later step and
continued there under the newer weights (their version spans name both versions, in order, covering every token);
no token the manager received was lost or generated again.

Run with `.venv/bin/pytest -m slow tests/e2e/test_agent_partial_rollout_e2e.py` (minutes on 2 cores).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.local_cli import run_local

REPO = Path(__file__).resolve().parents[2]
STEPS = 4  # three step boundaries: a carried episode must outlive the training between steps to change version
PARTIAL = "\n  maxStaleness: 1\n  partialRollout: true\n  partialRolloutOverProvision: 0.5"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_partial_rollout_carries_episodes_across_steps_and_loses_none(tmp_path: Path) -> None:
    text = (REPO / "examples" / "local-agent.yaml").read_text()
    assert "\nalgorithm:\n" in text, "examples/local-agent.yaml changed: update this test's edits"
    cfg = tmp_path / "job.yaml"
    cfg.write_text(text.replace("\nalgorithm:", "\nalgorithm:" + PARTIAL, 1))
    report_path, dump = tmp_path / "report.json", tmp_path / "rollouts.jsonl"
    run_local(
        "--config", cfg, "--steps", str(STEPS), "--run-dir", tmp_path / "run", "--json-report", report_path,
        "--dump-rollouts", dump, "--chaos-kill-every", "1", "--chaos-step-seconds", "1", timeout=540,
    )  # fmt: skip
    report = json.loads(report_path.read_text())
    steps, group = report["steps"], 8  # the example's groupSize
    assert report["ok"] and len(steps) == STEPS, report.get("error")
    episodes = [json.loads(line) for line in dump.read_text().splitlines()]
    keys = Counter((e["step"], e["prompt_index"], e["sample_index"]) for e in episodes)
    assert max(keys.values()) == 1, "an episode reached the trainer twice"
    per_group = Counter((step, prompt) for step, prompt, _ in keys)
    complete = sum(1 for n in per_group.values() if n == group)
    assert sum(s["trajectories"] for s in steps) == complete * group, "trained samples are not the complete groups'"
    assert any(s["carried_over"] > 0 for s in steps[:-1]), "no episode was carried into a later step"
    spanning = [e for e in episodes if len({v for v, _ in e.get("version_spans", [])}) > 1]
    assert spanning, "no carried episode went on under a newer version"
    for e in episodes:
        spans = e.get("version_spans", [])
        assert all(a[0] < b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
        assert not spans or (spans[0][0] == e["weight_version"] and sum(n for _, n in spans) == len(e["token_ids"]))
        assert len(e["loss_mask"]) == len(e["token_ids"])
    kills = [ev for ev in report["spot_events"] if ev.startswith("SIGKILL")]
    assert kills and all(re.search(r"\(chaos, [1-9]\d* running", ev) for ev in kills), kills
    assert report["tokens_lost"] == 0 and report["tokens_regenerated"] == 0
