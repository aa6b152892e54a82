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
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlboost.nats_server import free_port, wait_for_port
from rlboost.spec import JobSpec, ModelSpec, dump_job_spec, parse_job_spec
from rlboost.wire.rollout_io import EpisodeSettings, PromptItem, RolloutRequest, SamplingParams, Trajectory
from rlboost.wire.rollout_proto import status_from_pb
from tests.rollout_manager.client import status
from trainer.rollout_client import RolloutClient

TURNS, PROMPTS, GROUP = 3, 2, 2
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
    """A tiny random Qwen3 and a byte-level tokenizer with the Qwen-style chat template."""
    from rlboost.models.tiny import build_model
    from rlboost.models.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("tiny-chat")
    tok = train_tokenizer(["<|im_start|>user\nWhat is 3*4?<|im_end|>\n<|im_start|>tool\n12 characters<|im_end|>\n"])
    build_model(ModelSpec(hidden_size=32, num_layers=1, num_heads=2, seed=3), tok).save_pretrained(out)
    tok.save_pretrained(out)
    return out


class Job:
    """The manager, worker and env-runner processes of one test, logs under `root`, all killed at the end."""

    def __init__(self, root: Path, model_dir: Path, site: Path) -> None:
        self.root, self.model_dir = root, model_dir
        self.port = free_port()
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        spec = parse_job_spec(
            {
                "task": {"environment": {"name": "echo", "stepTimeoutSeconds": 30}},
                "algorithm": {"maxNewTokens": 12, "maxTurns": TURNS, "maxEpisodeTokens": 400},
                "rollout": {"leaseTimeoutMs": 60000},  # a loaded machine must not expire a live runner
            }
        )
        assert isinstance(spec, JobSpec)
        self.config = root / "job.yaml"
        self.config.write_text(dump_job_spec(spec))
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def spawn(self, name: str, *argv: str) -> None:
        with (self.root / f"{name}.log").open("wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *argv], stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    async def start(self) -> None:
        common = ("--config", str(self.config), "--nats-url", "", "--host", "127.0.0.1")
        self.spawn("manager", "rollout_manager", *common, "--port", str(self.port), "--metrics-port", "0")
        await asyncio.to_thread(wait_for_port, "127.0.0.1", self.port, 60, self.procs["manager"])
        model = ("--model-dir", str(self.model_dir), "--manager", self.target)
        self.spawn(
            "worker", "rollout_worker", *common, *model, "--worker-id", "w0", "--capacity", "4", "--weight-server", ""
        )
        self.start_runner("env-0")

    def start_runner(self, name: str) -> None:
        common = ("--config", str(self.config), "--nats-url", "", "--host", "127.0.0.1")
        self.spawn(name, "env_runner", *common, "--model-dir", str(self.model_dir), "--manager", self.target,
                   "--runner-id", name, "--capacity", "2")  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))


async def _status(target: str):
    try:
        return status_from_pb(await status(target))
    except Exception:  # noqa: BLE001 (not up yet: keep polling)
        return None


async def _until(predicate, job: Job, what: str, timeout: float = 180.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if value := await predicate():
            return value
        await asyncio.sleep(0.05)  # polling interval of a condition with a deadline
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{job.logs()}")


def _request(step: int) -> RolloutRequest:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=12, seed=5, stop_token_ids=(2,))
    tasks = [PromptItem(i, [], json.dumps({"question": f"What is {3 + i}*4?", "answer": "x"})) for i in range(PROMPTS)]
    return RolloutRequest(step, 0, tasks, GROUP, sampling, episodes=EpisodeSettings(TURNS, 400))


async def _collect(rc: RolloutClient, request: RolloutRequest, out: list[Trajectory]) -> None:
    async for traj in rc.rollout(request, reattach_s=60):
        out.append(traj)


async def test_episodes_run_through_real_processes_and_survive_a_killed_env_runner(model_dir, site, tmp_path):
    job = Job(tmp_path, model_dir, site)
    try:
        await job.start()

        async def ready():
            s = await _status(job.target)
            return s is not None and len(s.workers) == 1 and len(s.runners) == 1

        await _until(ready, job, "a worker and an env-runner registered")
        async with RolloutClient(job.target) as rc:
            first: list[Trajectory] = []
            await asyncio.wait_for(_collect(rc, _request(0), first), 240)
            assert len(first) == PROMPTS * GROUP
            for t in first:
                assert (t.turns, t.reward, t.finish_reason, t.episode.runner) == (TURNS, 3.0, "stop", "env-0")
                assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs) and 0 in t.loss_mask
                assert t.loss_mask[0] == 1 and t.loss_mask[-1] == 1  # the model's turns first and last
                assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
                assert t.episode.tool_calls == TURNS - 1 and t.workers == ["w0"]

            second: list[Trajectory] = []
            collecting = asyncio.create_task(_collect(rc, _request(1), second))

            async def in_flight():
                s = await _status(job.target)
                return s is not None and any(r.runner_id == "env-0" and r.running > 0 for r in s.runners)

            await _until(in_flight, job, "env-0 driving episodes")
            job.procs["env-0"].send_signal(signal.SIGKILL)
            job.start_runner("env-1")
            await asyncio.wait_for(collecting, 240)
        assert sorted((t.prompt_index, t.sample_index) for t in second) == sorted(
            (t.prompt_index, t.sample_index) for t in first
        )
        by_sample = {(t.prompt_index, t.sample_index): t for t in first}
        for t in second:  # greedy: the same episode, whichever runner finally drove it
            assert (t.response_ids, t.loss_mask) == (by_sample[t.prompt_index, t.sample_index].response_ids,
                                                     by_sample[t.prompt_index, t.sample_index].loss_mask)  # fmt: skip
        assert any(t.episode.runner == "env-1" for t in second)
        final = await _status(job.target)
        assert final is not None and final.episodes.finished == 2 * PROMPTS * GROUP and final.episodes.failed == 0
    finally:
        job.stop()
