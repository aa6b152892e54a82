"""End to end: agentic episodes (examples/local-agent.yaml: the calculator tool, the tiny model) with every real
service as a separate process on 127.0.0.1, env-runners included.

* Spot harvesting across turns: the job is run greedily (`--temperature 0`) once uninterrupted, then again while
  chaos SIGKILLs a spot worker each time the manager's status shows it streaming an unfinished response (a model
  turn). Each killed turn continues on another worker from the tokens already streamed; every episode must come out
  token for token the uninterrupted run's (model turns and the environment's parts alike), with the same loss
  mask and reward, no token lost, and the same final weights.
* The example learns: its episodes' reward rises over the run.

Run with `.venv/bin/pytest -m slow tests/e2e/test_agent_e2e.py` (minutes on 2 cores).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.local_cli import run_local as run_local_cli

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "local-agent.yaml"
STEPS = 2
RUN_TIMEOUT_S = 420
CHAOS = ("--chaos-kill-every", "1", "--chaos-step-seconds", "1")

Key = tuple[int, int, int]


def run_local(out: Path, *flags: str, steps: int = STEPS) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    """Run the example greedily; its JSON report and the dumped episodes keyed by (step, prompt, sample)."""
    report, dump = out / "report.json", out / "rollouts.jsonl"
    run_local_cli(
        "--config",
        CONFIG,
        "--steps",
        str(steps),
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
        assert key not in rollouts, f"episode {key} delivered twice"
        rollouts[key] = d
    return json.loads(report.read_text()), rollouts


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[Key, dict[str, Any]]]:
    report, rollouts = run_local(tmp_path_factory.mktemp("agent-uninterrupted"))
    assert report["preemptions"] == 0 and report["ok"]
    return report, rollouts


def caught_streaming(event: str) -> bool:
    match = re.search(r"\(chaos, (\d+) running, (\d+) tokens in flight\)", event)
    return bool(match) and int(match[1]) > 0 and int(match[2]) > 0


@pytest.mark.slow
def test_a_worker_killed_mid_turn_leaves_every_episode_token_for_token_the_same(uninterrupted, tmp_path: Path):
    expected_report, expected = uninterrupted
    assert any(d["turns"] >= 2 for d in expected.values()), "the episodes should be multi-turn"
    report, rollouts = run_local(tmp_path, *CHAOS)
    assert report["ok"] and set(rollouts) == set(expected)
    for field in ("token_ids", "loss_mask", "turns", "reward"):
        differ = [k for k in expected if rollouts[k][field] != expected[k][field]]
        assert differ == [], f"{field}: {len(differ)} episodes differ from the uninterrupted run, e.g. {differ[:3]}"
    kills = [e for e in report["spot_events"] if e.startswith("SIGKILL")]
    assert report["preemptions"] == len(kills) > 0 and all(caught_streaming(e) for e in kills), kills
    assert report["migrations_by_reason"].get("stream_broken", 0) > 0  # turns left their killed worker
    victims = {e.split()[1] for e in kills}
    continued = [d for d in rollouts.values() if len(d["workers"]) >= 2 and set(d["workers"]) & victims]
    assert continued, "no episode's turn was continued from a killed worker's tokens"
    # nothing lost: every model token the manager received is in exactly one delivered episode
    assert report["tokens_lost"] == 0 and report["tokens_regenerated"] == 0
    assert report["tokens_received"] == sum(sum(d["loss_mask"]) for d in rollouts.values())
    assert report["final_weights_checksum"] == expected_report["final_weights_checksum"]


@pytest.mark.slow
def test_the_agent_example_learns_to_use_its_tool(tmp_path: Path):
    report = tmp_path / "report.json"
    run_local_cli("--config", CONFIG, "--run-dir", tmp_path / "run", "--json-report", report, timeout=1500)
    steps = json.loads(report.read_text())["steps"]
    rewards = [s["reward_mean"] for s in steps]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10  # a step's mean is noisy: 128 episodes
    assert last > first + 0.08, rewards
    assert all(s["episode_turns_mean"] >= 1 and s["tool_calls"] > 0 for s in steps)
