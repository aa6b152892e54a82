"""Agentic episodes through real processes: `python -m rollout_manager`, a `python -m rollout_worker` (torch engine,
a tiny model with a chat-template tokenizer, greedy), `python -m env_runner` running a registered environment in
its confined processes, and the trainer's own RolloutClient asking for a step of episodes.

Every episode comes back whole: its turns, the environment's tokens masked (loss_mask 0) between the model's, the
environment's reward, its runner. Then the env-runner is SIGKILLed while its episodes are in flight (the manager's
status shows them running) and another one starts: the step completes, every episode once, and (greedy) token for
token what the uninterrupted step gave.

The environment is a real package registered under `rlboost.environments` (a dist-info with entry_points.txt in a
directory on the processes' PYTHONPATH): it answers every turn and ends the episode after its third.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from rlboost.wire.rollout_io import CarriedGroup, Trajectory, request_id
from tests.env_runner import procs
from tests.env_runner.procs import Job, Shape, collect, same_episodes, whole_step
from trainer.rollout_client import RolloutClient

SHAPE = Shape("echo")
TURNS, PROMPTS, GROUP = SHAPE.turns, SHAPE.prompts, SHAPE.group
ECHO = textwrap.dedent(
    '''
    from rlboost.environments.base import Step

    class Echo:
        """Answers every model turn with how long it was; the episode ends after the third turn, scored 3."""
        def reset(self, task):
            self.turns = 0
            return [{"role": "user", "content": task.question}]
        def step(self, action):
            self.turns += 1
            if self.turns == 3:
                return Step([], reward=float(self.turns), done=True)
            return Step([{"role": "tool", "content": f"{len(action)} characters"}], tool_calls=1)
    '''
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[Path]:
    site = tmp_path_factory.mktemp("echo-site")
    dist = site / "echo_env-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-env\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlboost.environments]\necho = echo_env:Echo\n")
    (site / "echo_env.py").write_text(ECHO)
    sys.path.insert(0, str(site))  # this process validates the job spec, which looks the name up too
    yield site
    sys.path.remove(str(site))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return procs.tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


async def test_episodes_run_through_real_processes_and_survive_a_killed_env_runner(model_dir, site, tmp_path):
    job = Job(tmp_path, model_dir, site, SHAPE)
    try:
        await job.start()
        await job.ready()
        async with RolloutClient(job.target) as rc:
            first = await whole_step(rc, SHAPE.request(0), 240)
            assert len(first) == PROMPTS * GROUP
            for t in first:
                assert (t.turns, t.reward, t.finish_reason, t.episode.runner) == (TURNS, 3.0, "stop", "env-0")
                assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs) and 0 in t.loss_mask
                assert t.loss_mask[0] == 1 and t.loss_mask[-1] == 1  # the model's turns first and last
                assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
                assert t.episode.tool_calls == TURNS - 1 and t.workers == ["w0"]

            second: list[Trajectory] = []
            collecting = asyncio.create_task(collect(rc, SHAPE.request(1), second))
            await job.until(job.runner_busy("env-0"), "env-0 driving episodes")
            job.procs["env-0"].send_signal(signal.SIGKILL)
            job.start_runner("env-1")
            await asyncio.wait_for(collecting, 240)
        same_episodes(first, second)  # greedy: the same episodes, whichever runner finally drove them
        assert any(t.episode.runner == "env-1" for t in second)
        final = await job.status()
        assert final is not None and final.episodes.finished == 2 * PROMPTS * GROUP and final.episodes.failed == 0
    finally:
        job.stop()


async def test_a_restarted_manager_reruns_the_episodes_runners_held_and_nothing_is_lost(model_dir, site, tmp_path):
    """The rollout-manager SIGKILLed while env-0 drives a step's episodes, then started again on its port: the
    runner and the worker reconnect, the trainer's stream re-attaches and asks for the step again, and the
    episodes the runner held start again from their tasks (a new manager does not adopt them: their environments'
    state lives in the runner, whose stream broke). What is lost is their time only: every episode arrives once,
    token for token (greedy, seeds per episode and turn) what the uninterrupted step gave."""
    job = Job(tmp_path, model_dir, site, SHAPE)
    try:
        await job.start()
        await job.ready()
        async with RolloutClient(job.target) as rc:
            first = await whole_step(rc, SHAPE.request(0), 240)
            second: list[Trajectory] = []
            collecting = asyncio.create_task(collect(rc, SHAPE.request(1), second))
            await job.until(job.runner_busy("env-0"), "env-0 driving episodes")
            job.procs["manager"].send_signal(signal.SIGKILL)
            job.procs["manager"].wait(10)
            job.start_manager()
            await asyncio.wait_for(collecting, 240)
        same_episodes(first, second)
        final = await job.status()
        assert final is not None and final.episodes.failed == 0 and len(final.runners) == 1
        assert final.episodes.finished > 0  # the new manager ran (again) the episodes the step still owed
    finally:
        job.stop()


async def test_partial_rollout_carries_episodes_past_a_step_end_and_through_a_killed_worker(model_dir, site, tmp_path):
    """algorithm.partialRollout with episodes, the trainer's side as trainer.partial_assembly asks for it: a step's
    stream ends once its target (1 group) is complete, its other episodes are carried and go on on their env-runner;
    the worker generating one of their turns is SIGKILLed between the steps and another starts; the next step lists
    the carried episodes and gets each once. No weight version changes here (no weight-server), so greedy, the
    episodes are token for token those of the same step rolled out whole; across a version change the spans differ
    (tests/rollout_manager/test_episode_carry.py)."""
    # long turns, to be caught generating; the runner drives 2 episodes at once: the third waits, so one is carried
    shape = Shape("echo", max_new_tokens=160, max_episode_tokens=700, prompts=3, group=1)
    job = Job(tmp_path, model_dir, site, shape)
    try:
        await job.start()
        await job.ready()
        async with RolloutClient(job.target) as rc:
            whole = await whole_step(rc, shape.request(0), 240)
            first = await whole_step(rc, replace(shape.request(1), target_groups=1), 240)
            assert 1 <= len(first) < shape.prompts  # the stream ended at its target
            await job.until(job.worker_streaming("w0"), "w0 generating a carried episode's turn")
            job.procs["w0"].send_signal(signal.SIGKILL)
            job.start_worker("w1")
            got = {t.prompt_index for t in first}
            tasks = shape.request(1).prompts
            owed = [CarriedGroup(1, p, [], [0], tasks[p].task_json) for p in range(shape.prompts) if p not in got]
            rest = await whole_step(rc, replace(shape.request(2), prompts=[], carried=owed, target_groups=len(owed)))
        delivered = [t.request_id for t in first + rest]
        assert sorted(delivered) == [request_id(1, p, 0) for p in range(shape.prompts)]  # every episode once
        same_episodes(whole, first + rest)
        final = await job.status()
        assert final is not None and final.episodes.failed == 0 and final.tokens_regenerated == 0
        assert final.migrations_by_reason.get("stream_broken", 0) >= 1  # the killed worker's turn moved on
    finally:
        job.stop()
