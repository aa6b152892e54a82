"""The trainer's side of agentic episodes: the loss mask in collate (environment tokens never reach the loss, KL or
entropy), the episode's own reward kept by the judge, episodes asked for in the Rollout request, the dump's turns
and loss_mask aligned with token_ids, and the step report's episode fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlboost.spec import parse_job_spec
from rlboost.tasks.base import Example
from rlboost.tasks.sandbox import RewardResult
from rlboost.wire.rollout_io import EpisodeStats, RolloutRequest, SamplingParams, Trajectory
from trainer.assembly import classify, with_prompts
from trainer.episode_report import RunnerMeter, episode_fields
from trainer.grpo import Sample, clipped_policy_loss, collate, token_logprobs
from trainer.judge import Judge
from trainer.rollout_dump import RolloutDump


def _episode(reward: float | None = 1.0, mask: bytes = b"\x01\x01\x00\x00\x01", turns: int = 2) -> Trajectory:
    stats = EpisodeStats(tool_calls=1, tool_failures=1, tool_seconds=0.3)
    return Trajectory("s0-p0-g0", 0, 0, 0, [5, 6, 7], [1, 2, 3, 4, 9], [-0.1, -0.2, 0.0, 0.0, -0.3], "stop", 0,
                      loss_mask=mask, turns=turns, reward=reward, episode=stats)  # fmt: skip


def test_collate_puts_the_loss_mask_into_the_response_mask():
    batch = collate([Sample(_episode(), 1.0, advantage=1.0)], pad_id=0)
    # response token j of a 3-token prompt is target 2 + j; the environment's tokens 2 and 3 are masked out
    assert batch.response_mask[0].tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert batch.num_tokens == 3
    plain = collate([Sample(_episode(mask=b""), 1.0)], pad_id=0)  # no mask: every response token trains
    assert plain.response_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]


def test_environment_tokens_get_no_gradient():
    """The loss's gradient at an environment token's logits is exactly zero; at a model token it is not."""
    batch = collate([Sample(_episode(), 1.0, advantage=1.0)], pad_id=0)
    logits = torch.randn(1, batch.input_ids.shape[1], 16, requires_grad=True)
    logp = token_logprobs(logits, batch.input_ids, 1.0)
    loss, stats = clipped_policy_loss(logp, logp.detach(), batch.advantages, batch.response_mask, 0.2, 1)
    loss.backward()
    grad = logits.grad[0].abs().sum(-1)  # position k predicts token k + 1
    assert grad[4] == 0 and grad[5] == 0  # predicting the environment's tokens (response 2, 3)
    assert grad[2] > 0 and grad[3] > 0 and grad[6] > 0 and stats.tokens == 3


async def test_the_judge_keeps_an_episode_s_own_reward_and_judges_the_others():
    class Sandbox:
        def __init__(self) -> None:
            self.items: list = []

        def score(self, items, deadline=None):
            self.items += items
            return [RewardResult(0.5) for _ in items]

    judge = Judge(parse_job_spec({}).task, decode=lambda ids: f"text{len(ids)}")
    judge.sandbox = Sandbox()  # type: ignore[assignment]  # stand-in: the reward sandbox's processes
    trajs = [_episode(reward=1.0), _episode(reward=None), _episode(reward=0.25)]
    trajs.append(Trajectory("x", 0, 0, 1, [5], [], [], "failed", 0))
    values = await judge.rewards(0, [Example("q", "a")], trajs)
    assert values == [1.0, 0.5, 0.25, 0.0]
    assert judge.sandbox.items == [("text5", Example("q", "a"))]  # only the episode its environment left unscored


def test_an_episodes_step_asks_for_tasks_not_tokens():
    spec = parse_job_spec(
        {"task": {"environment": {"name": "calculator"}}, "algorithm": {"maxTurns": 4, "maxEpisodeTokens": 300}}
    )
    request = RolloutRequest(3, 2, [], 8, SamplingParams())
    with_prompts(request, spec, [Example("What is 2*3?", "6", metadata={"k": 1})], [[1, 2]])
    (prompt,) = request.prompts
    assert prompt.token_ids == [] and json.loads(prompt.task_json)["answer"] == "6"
    assert (request.episodes.max_turns, request.episodes.max_episode_tokens) == (4, 300)
    single = RolloutRequest(3, 2, [], 8, SamplingParams())
    with_prompts(single, parse_job_spec({}), [Example("q", "a")], [[1, 2]])
    assert single.prompts[0].token_ids == [1, 2] and single.episodes is None


def test_the_dump_aligns_turns_and_loss_mask_with_token_ids(tmp_path: Path):
    dump = RolloutDump(tmp_path / "d.jsonl")
    dump.write(_episode())
    dump.write(Trajectory("s", 0, 0, 1, [5], [1, 2], [0.0, 0.0], "stop", 0))  # single-turn: no episode fields
    episode, single = (json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines())
    assert episode["turns"] == 2 and episode["loss_mask"] == [1, 1, 0, 0, 1] and episode["reward"] == 1.0
    assert len(episode["loss_mask"]) == len(episode["token_ids"])
    assert "turns" not in single and "loss_mask" not in single


def test_the_step_report_s_episode_fields():
    samples = [Sample(_episode(turns=2), 1.0), Sample(_episode(turns=4), 0.0)]
    fields = episode_fields(samples)
    assert fields["episode_turns_mean"] == 3 and fields["episode_turns_max"] == 4
    assert (fields["tool_calls"], fields["tool_failures"]) == (2, 2)
    assert fields["tool_latency_seconds"] == pytest.approx(0.6 / 8)  # (2 + 4 turns + 2 resets) calls
    assert episode_fields([Sample(Trajectory("s", 0, 0, 0, [1], [2], [0.0], "stop", 0), 1.0)]) == {}


def test_the_runner_meter_reports_growth_since_the_previous_step():
    from rlboost.wire.rollout_io import EpisodeCounts, ManagerStatus, RunnerStatus

    def status(idle: float, busy: float, capacity: float) -> ManagerStatus:
        counts = EpisodeCounts(idle_slot_seconds_in_tools=idle, runner_episode_seconds=busy,
                               runner_capacity_seconds=capacity)  # fmt: skip
        return ManagerStatus([], 0, 0, 0, 0, 0, runners=[RunnerStatus("r", "n", 4, 0, 0)], episodes=counts)

    meter = RunnerMeter()
    assert meter.update(status(10.0, 30.0, 40.0)) == {"env_runner_utilisation": 0.75, "idle_slot_seconds_in_tools": 10}
    assert meter.update(status(12.0, 40.0, 80.0)) == {"env_runner_utilisation": 0.25, "idle_slot_seconds_in_tools": 2}
    assert meter.update(None) == {}


@pytest.mark.parametrize(
    ("oldest", "max_staleness", "expected"),
    [(5, 0, (False, 1.0)), (4, 1, (True, 1.0)), (4, 0, (False, 0.0)), (3, 2, (True, 1.0)), (3, 1, (False, 0.0))],
)
def test_bounded_staleness_counts_an_episode_by_its_oldest_turn(oldest: int, max_staleness: int, expected):
    """An episode whose first turn was sampled at `oldest` and its last at 5, trained at version 5: within
    algorithm.maxStaleness it trains (stale, importance-corrected), past it it is skipped; its newer turns do not
    make it younger."""
    spans = [(oldest, 2), (5, 3)] if oldest != 5 else []
    traj = _episode()
    traj.weight_version, traj.version_spans = oldest, spans
    request = RolloutRequest(7, 5, [], 1, SamplingParams())
    assert classify(request.weight_version, traj, max_staleness) == expected
