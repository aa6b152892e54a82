"""The trainer's side of a suspension (spec.suspend, a Kueue preemption), as a real `python -m trainer` process.

The operator's suspend request arrives over NATS while step 1's rollout is under way: the trainer answers "not yet",
finishes step 1, checkpoints it although no checkpoint was due (trainer.checkpointEvery 100), answers
"checkpointed after 2 steps" and asks for no further rollout. Killed (its pod scaled to zero) and started again with
--resume, it finishes the job with the same final weights as a run that was never paused.

Peers as in test_loop.py: a real nats-server and weight-server, and the stand-in rollout-manager (tests/trainer/
peers.py) in the place of the manager and its workers; the test itself sends what the operator sends
(rlboost_operator.suspension: a SuspendRequest on the `suspend` subject).
"""

from __future__ import annotations

import asyncio
import sys

import nats
import pytest

from rlboost.models import load_tokenizer, stop_token_ids
from rlboost.spec import dump_job_spec
from rlboost.wire.events import DONE, SUSPEND, SuspendReply, SuspendRequest
from tests.helpers import wait_until_async
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import StandInManager, WeightServerProcess, child_env, start_manager, wait_process

STEPS = 3


def _cmd(tmp_path, target: str, ws: WeightServerProcess, nats_url: str, job: str, *extra: str) -> list[str]:
    config = tmp_path / "job.yaml"
    return [
        sys.executable, "-m", "trainer", "--config", str(config), "--manager", target, "--weight-server", ws.url,
        "--token-file", str(ws.token_file), "--model-dir", str(tmp_path / "model"), "--run-dir",
        str(tmp_path / "run"), "--nats-url", nats_url, "--job", job, "--steps", str(STEPS), "--connect-timeout", "20",
        "--checkpoint-dir", str(tmp_path / "checkpoints"), *extra,
    ]  # fmt: skip


def _setup(tmp_path, tiny_model_dir) -> StandInManager:
    (tmp_path / "model").symlink_to(tiny_model_dir)
    spec = tiny_spec().model_copy(update={"trainer": tiny_spec().trainer.model_copy(update={"checkpoint_every": 100})})
    (tmp_path / "job.yaml").write_text(dump_job_spec(spec))
    tok = load_tokenizer(tiny_model_dir)
    return StandInManager(tok, stop_token_ids(tok)[0])


async def _run_to_end(tmp_path, stand_in, nats_url: str, job: str, *extra: str) -> str:
    """The trainer to its end; the final weights checksum its `done` reported."""
    server, target = await start_manager(stand_in)
    nc = await nats.connect(nats_url)
    done: list = []

    async def on_done(msg) -> None:
        done.append(DONE.decode(msg.data))

    await nc.subscribe(DONE.subject("default", job), cb=on_done)
    try:
        with WeightServerProcess(tmp_path / "ws", nats_url, job=job) as ws:
            proc = await asyncio.create_subprocess_exec(
                *_cmd(tmp_path, target, ws, nats_url, job, *extra), stderr=asyncio.subprocess.PIPE, env=child_env()
            )
            code, err = await wait_process(proc, 300)
            assert code == 0, err[-3000:]
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    assert len(done) == 1 and done[0].ok and done[0].steps == STEPS
    return done[0].final_weights_checksum


async def _ask(nc, job: str) -> SuspendReply | None:
    """One request as the operator sends it; None while no trainer listens."""
    try:
        msg = await nc.request(SUSPEND.subject("default", job), SUSPEND.encode(SuspendRequest(reason="test")), 5)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return None
    return SuspendReply.model_validate_json(msg.data)


@pytest.mark.slow
async def test_a_suspend_request_checkpoints_at_the_step_boundary_and_the_resumed_run_ends_bit_exact(
    tmp_path, tiny_model_dir, nats_server
):
    reference = tmp_path / "reference"
    reference.mkdir()
    uninterrupted = await _run_to_end(reference, _setup(reference, tiny_model_dir), nats_server.url, "ref")

    paused = tmp_path / "paused"
    paused.mkdir()
    gate = asyncio.Event()
    stand_in = _setup(paused, tiny_model_dir)
    stand_in.gates = {1: gate}  # step 1's rollout waits: the request comes mid-step
    server, target = await start_manager(stand_in)
    nc = await nats.connect(nats_server.url)
    try:
        with WeightServerProcess(paused / "ws", nats_server.url, job="p") as ws:
            cmd = _cmd(paused, target, ws, nats_server.url, "p")
            proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, env=child_env())
            await wait_until_async(lambda: len(stand_in.requests) == 2, timeout=180, what="step 1's rollout")
            # Step 1's rollout is asked for as soon as step 0's weights are published, before step 0 is reported
            # (trainer.loop: _opens_next_early), so the first answers may still say 0 steps done.
            mid_step = await wait_until_async_value(
                lambda: _answer_where(nc, "p", lambda r: r.steps_done >= 1), "the trainer's answer"
            )
            assert not mid_step.checkpointed and mid_step.steps_done == 1  # step 1 is under way: not yet
            assert not (paused / "checkpoints" / "step-00000002").exists()
            gate.set()
            done = await wait_until_async_value(
                lambda: _answer_where(nc, "p", lambda r: r.checkpointed), "checkpointed", timeout=120
            )
            assert done.steps_done == 2 and done.weights_checksum
            assert (paused / "checkpoints" / "step-00000002").is_dir()  # written although none was due
            assert [r.step for r in stand_in.requests] == [0, 1]  # no step 2 started
            assert proc.returncode is None  # it waits to be stopped, as a pod scaled to zero is
            proc.terminate()  # the pod going away: SIGTERM, which a trainer that is PID 1 ignores without a handler
            code, err = await wait_process(proc, 30)
            assert code == 143 and "stopped by SIGTERM after 2 steps" in err, err[-2000:]
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    stand_in.gates = {}
    resumed = await _run_to_end(paused, stand_in, nats_server.url, "p", "--resume")
    assert [r.step for r in stand_in.requests] == [0, 1, 2]  # resumed after step 1: nothing done twice
    assert resumed == uninterrupted


async def _answer_where(nc, job: str, wanted) -> SuspendReply | None:
    """One request; its answer if `wanted(answer)`, else None (asked again by wait_until_async_value)."""
    reply = await _ask(nc, job)
    return reply if reply is not None and wanted(reply) else None


async def wait_until_async_value(ask, what: str, timeout: float = 60.0):
    """Ask (a coroutine function) until it returns a value, within `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        value = await ask()
        if value is not None:
            return value
        await asyncio.sleep(0.2)  # the polling interval of a condition with a deadline
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
