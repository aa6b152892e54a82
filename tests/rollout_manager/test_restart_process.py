"""The rollout-manager restarts without losing the step, with real processes: `python -m rollout_manager`, two
`python -m rollout_worker` (torch engine, a tiny model, greedy) and the trainer's own RolloutClient.

The manager is SIGKILLed when its status shows a worker streaming an unfinished response (an event, not a clock);
a new manager starts on the same port; the workers re-register reporting the responses they held, the client
re-attaches with the ids it already has, and the step completes with every sample once and the same token ids as
an uninterrupted run of the same prompts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rlboost.nats_server import free_port, wait_for_port
from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams, Trajectory
from rlboost.wire.rollout_proto import status_from_pb
from tests.rollout_manager.client import status
from tests.rollout_worker.conftest import make_tiny_model
from trainer.rollout_client import RolloutClient

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PROMPTS, GROUP, MAX_NEW_TOKENS = 2, 2, 160


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-restart"))


class Processes:
    """The manager and workers of one test, their logs under `root`, all killed at the end."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        self.root, self.model_dir = root, model_dir
        self.port, self.metrics_port = free_port(), free_port()
        self.manager: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.managers_started = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        with (self.root / f"{name}.log").open("wb") as out:
            return subprocess.Popen([sys.executable, "-m", *argv], stdout=out, stderr=subprocess.STDOUT, env=ENV)

    async def start_manager(self) -> None:
        self.managers_started += 1
        self.manager = self._spawn(
            [
                "rollout_manager",
                "--port",
                str(self.port),
                "--metrics-port",
                str(self.metrics_port),
                "--nats-url",
                "",
                "--host",
                "127.0.0.1",
            ],
            f"manager-{self.managers_started}",
        )
        await asyncio.to_thread(wait_for_port, "127.0.0.1", self.port, 60, self.manager)

    def start_workers(self, n: int) -> None:
        for i in range(n):
            self.workers.append(
                self._spawn(
                    [
                        "rollout_worker",
                        "--worker-id",
                        f"spot-{i}",
                        "--pool",
                        "spot",
                        "--node",
                        f"node-{i}",
                        "--manager",
                        self.target,
                        "--model-dir",
                        str(self.model_dir),
                        "--metrics-port",
                        "0",
                        "--capacity",
                        "2",
                        "--weight-server",
                        "",
                        "--nats-url",
                        "",
                        "--reconnect-timeout",
                        "60",
                    ],
                    f"worker-{i}",
                )
            )

    def kill_manager(self) -> None:
        assert self.manager is not None
        self.manager.send_signal(signal.SIGKILL)
        self.manager.wait(10)

    def stop(self) -> None:
        for proc in [self.manager, *self.workers]:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.log")))


def _request(step: int) -> RolloutRequest:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, seed=11)
    prompts = [PromptItem(i, [5 + i, 17, 23 + 3 * i, 40]) for i in range(PROMPTS)]
    return RolloutRequest(step, 0, prompts, GROUP, sampling, vocab_size=64)


async def _wait(predicate, timeout: float, what: str, procs: Processes):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if value := await predicate():
            return value
        await asyncio.sleep(0.02)  # polling interval of a condition with a deadline
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{procs.logs()}")


async def _streaming_unfinished(target: str) -> bool:
    """The manager's status shows a worker holding streamed tokens of a response still running on it."""
    try:
        s = status_from_pb(await status(target))
    except Exception:  # noqa: BLE001 (not up yet: keep polling)
        return False
    return any(w.inflight_tokens > 0 for w in s.workers)


async def _workers_registered(target: str, n: int) -> bool:
    try:
        return len((await status(target)).workers) == n
    except Exception:  # noqa: BLE001
        return False


async def _collect(rc: RolloutClient, request: RolloutRequest, out: list[Trajectory]) -> None:
    async for traj in rc.rollout(request, reattach_s=60):
        out.append(traj)


def _by_sample(trajs: list[Trajectory]) -> dict[tuple[int, int], list[int]]:
    return {(t.prompt_index, t.sample_index): t.response_ids for t in trajs}


async def test_sigkilled_manager_restarts_and_the_step_completes_with_every_sample_once(model_dir, tmp_path):
    procs = Processes(tmp_path, model_dir)
    try:
        await procs.start_manager()
        procs.start_workers(2)
        await _wait(lambda: _workers_registered(procs.target, 2), 120, "two workers registered", procs)
        async with RolloutClient(procs.target) as rc:
            baseline: list[Trajectory] = []
            await asyncio.wait_for(_collect(rc, _request(0), baseline), 120)

            got: list[Trajectory] = []
            step = asyncio.create_task(_collect(rc, _request(1), got))
            await _wait(lambda: _streaming_unfinished(procs.target), 60, "a worker streaming a response", procs)
            procs.kill_manager()
            assert not step.done(), "the step finished before the kill: responses too short to test a restart"
            await procs.start_manager()
            await asyncio.wait_for(step, 120)

        assert len(got) == PROMPTS * GROUP and len({t.request_id for t in got}) == len(got), "lost or duplicated"
        assert _by_sample(got) == _by_sample(baseline), "trajectories differ from the uninterrupted run"
        assert all(len(t.logprobs) == len(t.response_ids) == MAX_NEW_TOKENS for t in got)
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"http://127.0.0.1:{procs.metrics_port}/metrics")).text
        adopted = [
            ln
            for ln in metrics.splitlines()
            if ln.startswith('rlboost_manager_adopted_requests_total{result="adopted"}')
        ]
        assert adopted and float(adopted[0].split()[-1]) >= 1, f"no held response adopted:\n{procs.logs()}"
    finally:
        procs.stop()
