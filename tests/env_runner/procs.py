"""Real processes of an agentic job for the env-runner's process tests: `python -m rollout_manager`, torch
`python -m rollout_worker`s (a tiny model with a chat-template tokenizer) and `python -m env_runner`s, on 127.0.0.1,
their logs under the test's directory, all killed at the end; and the trainer's side of a step (RolloutClient)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rlboost.nats_server import free_port, wait_for_port
from rlboost.spec import JobSpec, ModelSpec, dump_job_spec, parse_job_spec
from rlboost.wire.rollout_io import EpisodeSettings, PromptItem, RolloutRequest, SamplingParams, Trajectory
from rlboost.wire.rollout_proto import status_from_pb
from tests.rollout_manager.client import status
from trainer.rollout_client import RolloutClient


def tiny_chat_model(out: Path) -> Path:
    """A tiny random Qwen3 and a byte-level tokenizer with the Qwen-style chat template, saved in `out`."""
    from rlboost.models.tiny import build_model
    from rlboost.models.tokenizer import train_tokenizer

    tok = train_tokenizer(["<|im_start|>user\nWhat is 3*4?<|im_end|>\n<|im_start|>tool\n12 characters<|im_end|>\n"])
    build_model(ModelSpec(hidden_size=32, num_layers=1, num_heads=2, seed=3), tok).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@dataclass(frozen=True)
class Shape:
    """The episodes of a test job: its environment, turns and tokens, and the step's prompts and group."""

    environment: str
    turns: int = 3
    max_new_tokens: int = 12
    max_episode_tokens: int = 400
    prompts: int = 2
    group: int = 2

    def request(self, step: int) -> RolloutRequest:
        """A greedy step of episodes, as the trainer asks for it."""
        sampling = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens, seed=5, stop_token_ids=(2,))
        tasks = [
            PromptItem(i, [], json.dumps({"question": f"What is {3 + i}*4?", "answer": str(12 + 4 * i)}))
            for i in range(self.prompts)
        ]
        settings = EpisodeSettings(self.turns, self.max_episode_tokens)
        return RolloutRequest(step, 0, tasks, self.group, sampling, episodes=settings)


class Job:
    """The manager, worker and env-runner processes of one test, logs under `root`, all killed at the end."""

    def __init__(self, root: Path, model_dir: Path, site: Path, shape: Shape) -> None:
        self.root, self.model_dir, self.shape = root, model_dir, shape
        self.port = free_port()
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        spec = parse_job_spec(
            {
                "task": {"environment": {"name": shape.environment, "stepTimeoutSeconds": 30}},
                "algorithm": {
                    "maxNewTokens": shape.max_new_tokens,
                    "maxTurns": shape.turns,
                    "maxEpisodeTokens": shape.max_episode_tokens,
                },
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

    @property
    def common(self) -> tuple[str, ...]:
        return ("--config", str(self.config), "--nats-url", "", "--host", "127.0.0.1")

    async def start(self, workers: int = 1, worker_capacity: int = 4) -> None:
        self.start_manager()
        await asyncio.to_thread(wait_for_port, "127.0.0.1", self.port, 60, self.procs["manager"])
        for i in range(workers):
            self.start_worker(f"w{i}", worker_capacity)
        self.start_runner("env-0")

    def start_manager(self) -> None:
        """The rollout-manager on the job's port (again, after a kill: its log goes on in manager-N.log)."""
        n = sum(name.startswith("manager") for name in self.procs)
        self.spawn(f"manager-{n}" if n else "manager", "rollout_manager", *self.common, "--port", str(self.port),
                   "--metrics-port", "0")  # fmt: skip

    def start_worker(self, name: str, capacity: int = 4) -> None:
        model = ("--model-dir", str(self.model_dir), "--manager", self.target)
        self.spawn(name, "rollout_worker", *self.common, *model, "--worker-id", name, "--capacity", str(capacity),
                   "--weight-server", "")  # fmt: skip

    def start_runner(self, name: str) -> None:
        self.spawn(name, "env_runner", *self.common, "--model-dir", str(self.model_dir), "--manager", self.target,
                   "--runner-id", name, "--capacity", "2")  # fmt: skip

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))

    async def status(self):
        """The manager's status, or None while it does not answer."""
        try:
            return status_from_pb(await status(self.target))
        except Exception:  # noqa: BLE001 (not up yet: keep polling)
            return None

    async def until(self, predicate, what: str, timeout: float = 180.0):
        """`await predicate()`'s first truthy value, polled until the deadline (then the processes' logs)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if value := await predicate():
                return value
            await asyncio.sleep(0.05)  # polling interval of a condition with a deadline
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")

    def runner_busy(self, runner_id: str):
        """A predicate for `until`: the manager's status shows `runner_id` driving episodes."""

        async def busy() -> bool:
            s = await self.status()
            return s is not None and any(r.runner_id == runner_id and r.running > 0 for r in s.runners)

        return busy

    def worker_streaming(self, worker_id: str):
        """A predicate for `until`: the manager's status shows `worker_id` holding a turn it streamed tokens of."""

        async def streaming() -> bool:
            s = await self.status()
            return s is not None and any(
                w.worker_id == worker_id and w.running > 0 and w.inflight_tokens > 0 for w in s.workers
            )

        return streaming

    async def ready(self, workers: int = 1, runners: int = 1) -> None:
        async def up():
            s = await self.status()
            return s is not None and len(s.workers) == workers and len(s.runners) == runners

        await self.until(up, f"{workers} workers and {runners} env-runners registered")


async def collect(rc: RolloutClient, request: RolloutRequest, out: list[Trajectory]) -> None:
    async for traj in rc.rollout(request, reattach_s=60):
        out.append(traj)


async def whole_step(rc: RolloutClient, request: RolloutRequest, timeout: float = 240) -> list[Trajectory]:
    """A step's episodes, all of them."""
    out: list[Trajectory] = []
    await asyncio.wait_for(collect(rc, request, out), timeout)
    return out


def same_episodes(expected: list[Trajectory], got: list[Trajectory]) -> None:
    """Every episode once, each token for token and mask for mask the expected one (greedy runs)."""
    by_sample = {(t.prompt_index, t.sample_index): t for t in expected}
    assert sorted(by_sample) == sorted((t.prompt_index, t.sample_index) for t in got)
    for t in got:
        want = by_sample[t.prompt_index, t.sample_index]
        assert (t.response_ids, t.loss_mask) == (want.response_ids, want.loss_mask), (t.prompt_index, t.sample_index)
