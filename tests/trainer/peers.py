"""The trainer's peers for tests: a real weight-server subprocess and a stand-in rollout-manager.

The stand-in implements only the manager's `Rollout` call with the generated servicer base, over real
gRPC on loopback (the real rollout-manager is written concurrently; no workers generate here). It
answers each prompt's sample g with the right sum when g is even and a wrong one when g is odd, so every
group has reward variance, and streams the trajectories in a shuffled order.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rlboost.nats_server import free_port, wait_for_port
from rlboost.rollout.v1 import rollout_pb2_grpc
from rlboost.rollout.v1.rollout_pb2 import TrajectoryBatch
from rlboost.wire.rollout_io import RolloutRequest, Trajectory, request_id
from rlboost.wire.rollout_proto import rollout_request_from_pb, trajectory_to_pb

TOKEN = "trainer-test-token"
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def child_env() -> dict[str, str]:
    """This process's env without the rendezvous vars an in-process DeepSpeed engine set (its port is taken)."""
    return {k: v for k, v in os.environ.items() if k not in _DIST_VARS}


_QUESTION = re.compile(r"What is (\d+)\+(\d+)\?")


class WeightServerProcess:
    """`python -m weight_server` on a free loopback port (a real child process)."""

    def __init__(self, root: Path, nats_url: str | None = None, job: str = "test") -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        self.token_file = root / "token"
        self.token_file.write_text(TOKEN)
        self.args = ["--port", str(self.port), "--data-dir", str(root / "data"), "--token-file", str(self.token_file)]
        self.args += ["--nats-url", nats_url, "--job", job] if nats_url else ["--no-nats"]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> WeightServerProcess:
        self.log = open(self.root / "weight-server.log", "ab")  # noqa: SIM115 (closed in __exit__ or kill)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weight_server", *self.args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
        wait_for_port("127.0.0.1", self.port, 60, self.proc)
        return self

    def kill(self) -> None:
        """SIGKILL it (a crash: nothing flushed, nothing cleaned up); `__enter__` starts it again on its data."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def __exit__(self, *_: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@dataclass
class StandInManager(rollout_pb2_grpc.RolloutManagerServicer):
    """Answers Rollout from a tokenizer; records the requests and the trajectories it sent."""

    tokenizer: object
    stop_id: int
    fail_at_step: int | None = None
    gates: dict[int, asyncio.Event] = field(default_factory=dict)  # step -> released when set
    dropped: set[tuple[int, int]] = field(default_factory=set)  # (prompt, sample) sent as finish_reason "failed"
    requests: list[RolloutRequest] = field(default_factory=list)
    sent: list[Trajectory] = field(default_factory=list)

    def _response(self, prompt_ids: list[int], sample: int) -> list[int]:
        text = self.tokenizer.decode(prompt_ids)
        a, b = map(int, _QUESTION.search(text).groups())
        answer = a + b if sample % 2 == 0 else a + b + 1
        return list(self.tokenizer.encode(str(answer), add_special_tokens=False)) + [self.stop_id]

    async def Rollout(self, request, context):  # noqa: N802 (gRPC method name)
        req = rollout_request_from_pb(request)
        self.requests.append(req)
        if req.step in self.gates:
            await asyncio.wait_for(self.gates[req.step].wait(), 120)
        if self.fail_at_step is not None and req.step == self.fail_at_step:
            # not UNAVAILABLE: the trainer re-attaches to a manager that went away
            await context.abort(grpc.StatusCode.ABORTED, "stand-in manager: no workers left")
        trajs = []
        for p in req.prompts:
            for g in range(req.group_size):
                resp = [] if (p.prompt_index, g) in self.dropped else self._response(p.token_ids, g)
                trajs.append(
                    Trajectory(
                        request_id=request_id(req.step, p.prompt_index, g),
                        step=req.step,
                        prompt_index=p.prompt_index,
                        sample_index=g,
                        prompt_ids=p.token_ids,
                        response_ids=resp,
                        logprobs=[-1.0] * len(resp),
                        finish_reason="failed" if (p.prompt_index, g) in self.dropped else "stop",
                        weight_version=req.weight_version,
                        workers=["stand-in-0"],
                    )
                )
        random.Random(req.step).shuffle(trajs)
        for t in trajs:  # one per message: exercises the trainer's streaming path at its finest grain
            self.sent.append(t)
            yield TrajectoryBatch(trajectories=[trajectory_to_pb(t)])


async def start_manager(servicer: StandInManager) -> tuple[grpc.aio.Server, str]:
    """Serve the stand-in on a free loopback port in the running event loop."""
    server = grpc.aio.server()
    rollout_pb2_grpc.add_RolloutManagerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Async `wait_until`: await `predicate()` until truthy or fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)  # poll interval, bounded by the deadline above
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def wait_process(proc: asyncio.subprocess.Process, timeout: float) -> tuple[int, str]:
    """Wait for a child (killing it on timeout); returns (exit code, stderr text)."""
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        _, err = await proc.communicate()
        raise AssertionError(f"process did not finish in {timeout}s; stderr tail:\n{err.decode()[-3000:]}") from None
    return proc.returncode, err.decode()
