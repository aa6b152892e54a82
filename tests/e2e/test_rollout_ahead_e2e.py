"""algorithm.rolloutAhead end to end (`rlboost local`, every service a real process): each step after the first
trains on samples the workers generated with the previous step's weights, so its Rollout reached the manager
before those weights were published; every sample arrives, is counted stale and trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.local_cli import finish_local, run_local, start_local


@pytest.mark.slow
def test_each_step_trains_on_the_rollout_made_while_the_previous_step_trained(tmp_path: Path) -> None:
    config = tmp_path / "ahead.yaml"
    config.write_text("algorithm:\n  rolloutAhead: 1\n  maxStaleness: 1\n")
    dump = tmp_path / "rollouts.jsonl"
    run_local("--config", config, "--steps", "4", "--run-dir", tmp_path / "run", "--dump-rollouts", dump)
    versions = weight_versions(dump)
    # step 0 is rolled out at the start's weights; step s > 0 at version s - 1, while step s - 1 trained
    assert versions == {0: {0}, 1: {0}, 2: {1}, 3: {2}}
    steps = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert [s["stale"] for s in steps] == [0, 256, 256, 256]  # each importance-corrected, none skipped
    assert all(s["trajectories"] == 256 and s["off_policy"] == 0 for s in steps)
    assert steps[1]["stale_tokens"] == steps[1]["tokens"] > 0


@pytest.mark.slow
def test_a_step_after_an_evaluation_is_not_run_ahead(tmp_path: Path) -> None:
    """The evaluation's Rollout runs between two steps; the next step's rollout is not started beside it, so that
    step is rolled out at its own weights (on-policy), and the one after it runs ahead again."""
    config = tmp_path / "ahead.yaml"
    config.write_text(
        "algorithm:\n  rolloutAhead: 1\n  maxStaleness: 1\nevaluation:\n  everySteps: 2\n  prompts: 8\n  samples: 1\n"
    )
    dump = tmp_path / "rollouts.jsonl"
    run_local("--config", config, "--steps", "5", "--run-dir", tmp_path / "run", "--dump-rollouts", dump)
    versions = weight_versions(dump)
    assert versions == {0: {0}, 1: {0}, 2: {2}, 3: {2}, 4: {4}}  # evaluations after steps 1, 3 and 4 (the last)
    steps = read_jsonl(tmp_path / "run" / "steps.jsonl")
    assert [s["stale"] for s in steps] == [0, 256, 0, 256, 0]
    assert [s.get("validation") is not None for s in steps] == [False, True, False, True, True]


@pytest.mark.slow
def test_with_the_trainers_old_logprobs_a_run_ahead_is_bit_reproducible(tmp_path: Path) -> None:
    """rolloutCorrection.oldLogprobs 'trainer': the stale rows' old log-probs are the trainer's, under the weights it
    published one version before, so nothing whose bits depend on how a worker batched its requests reaches the
    weights. Two 20-step runs at once (their workers batch differently) end on the same weights; with the workers'
    log-probs (the default) they did not, twice in two tries (in 5 steps they still agreed)."""
    config = tmp_path / "ahead.yaml"
    config.write_text(
        "algorithm:\n  rolloutAhead: 1\n  maxStaleness: 1\n  rolloutCorrection:\n    oldLogprobs: trainer\n"
    )
    runs = [
        (
            "--config",
            config,
            "--steps",
            "20",
            "--run-dir",
            tmp_path / f"run{i}",
            "--json-report",
            tmp_path / f"{i}.json",
        )
        for i in range(2)
    ]
    for proc, args in [(start_local(*args), args) for args in runs]:
        finish_local(proc, *args)
    checksums = {json.loads((tmp_path / f"{i}.json").read_text())["final_weights_checksum"] for i in range(2)}
    assert len(checksums) == 1 and "" not in checksums
    steps = read_jsonl(tmp_path / "run0" / "steps.jsonl")
    assert [s["stale"] for s in steps] == [0] + [256] * 19  # every later step trained on stale rows


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def weight_versions(dump: Path) -> dict[int, set[int]]:
    """Each step's samples' weight versions, from a --dump-rollouts file."""
    versions: dict[int, set[int]] = {}
    for sample in read_jsonl(dump):
        versions.setdefault(sample["step"], set()).add(sample["weight_version"])
    return versions
