"""The trainer end to end: `python -m trainer` as a real process, two GRPO steps.

Peers: a real nats-server (fixture), a real weight-server process, and a stand-in rollout-manager
(tests/trainer/peers.py: the generated servicer base over real gRPC; the real manager is written
concurrently, and no workers generate here).
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import nats
import pytest

from rlboost.models import load_tokenizer, stop_token_ids
from rlboost.nats_server import free_port
from rlboost.spec import dump_job_spec
from rlboost.weights.checksum import state_checksum
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_from_bytes
from rlboost.wire.events import DONE, STEPS, WEIGHTS, JobDone, StepReport, step_gauges
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import (
    TOKEN,
    StandInManager,
    WeightServerProcess,
    child_env,
    start_manager,
    wait_for,
    wait_process,
)


async def _collect(nc, job: str) -> dict[str, list]:
    got: dict[str, list] = {"steps": [], "done": [], "weights": []}
    for topic in (STEPS, DONE, WEIGHTS):

        async def handler(msg, topic=topic):
            got[topic.name].append(topic.decode(msg.data))

        await nc.subscribe(topic.subject("default", job), cb=handler)
    await nc.flush()
    return got


def _trainer_cmd(tmp_path, config, manager: str, ws, nats_url: str, job: str, steps: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer",
        "--config",
        str(config),
        "--manager",
        manager,
        "--weight-server",
        ws.url,
        "--token-file",
        str(ws.token_file),
        "--model-dir",
        str(config.parent / "model"),
        "--run-dir",
        str(tmp_path / "run"),
        "--nats-url",
        nats_url,
        "--job",
        job,
        "--steps",
        str(steps),
        "--dump-rollouts",
        str(tmp_path / "rollouts.jsonl"),
        "--connect-timeout",
        "20",
    ]


def _setup(tmp_path, tiny_model_dir):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "model").symlink_to(tiny_model_dir)
    config = job_dir / "job.yaml"
    config.write_text(dump_job_spec(tiny_spec()))
    tok = load_tokenizer(tiny_model_dir)
    return config, tok


async def run_trainer(tmp_path, config, stand_in: StandInManager, nats_url: str, job: str, steps: int):
    """`python -m trainer` for `steps` against the stand-in manager, a real weight-server and NATS, to its exit:
    (exit code, stderr, the job's NATS events)."""
    server, target = await start_manager(stand_in)
    nc = await nats.connect(nats_url)
    events = await _collect(nc, job)
    try:
        with WeightServerProcess(tmp_path / "ws", nats_url, job=job) as ws:
            cmd = _trainer_cmd(tmp_path, config, target, ws, nats_url, job, steps=steps)
            proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, env=child_env())
            code, err = await wait_process(proc, 240)
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    return code, err, events


@pytest.mark.slow
async def test_two_steps_end_to_end(tmp_path, tiny_model_dir, nats_server):
    config, tok = _setup(tmp_path, tiny_model_dir)
    gate = asyncio.Event()
    stand_in = StandInManager(tok, stop_token_ids(tok)[0], gates={1: gate})
    server, target = await start_manager(stand_in)
    nc = await nats.connect(nats_server.url)
    events = await _collect(nc, "t2")
    metrics_port = free_port()
    try:
        with WeightServerProcess(tmp_path / "ws", nats_server.url, job="t2") as ws:
            cmd = _trainer_cmd(tmp_path, config, target, ws, nats_server.url, "t2", steps=2)
            cmd += ["--metrics-port", str(metrics_port)]
            proc = await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, env=child_env())
            # Step 1's rollout is held until /metrics shows step 0 done: a scrape at a known point.
            scraped = await _scrape_after_step0(metrics_port, proc)
            gate.set()
            code, err = await wait_process(proc, 240)
            assert code == 0, err[-3000:]
            async with WeightClient(ws.url, token=TOKEN) as wc:
                assert (await wc.versions()).versions == [0, 1, 2]
                final = state_checksum(state_from_bytes(await wc.pull(2)))
                v0 = state_checksum(state_from_bytes(await wc.pull(0)))
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)

    # The manager was asked for step s with weight version s, with the job's sampling.
    assert [(r.step, r.weight_version, len(r.prompts), r.group_size) for r in stand_in.requests] == [
        (0, 0, 2, 2),
        (1, 1, 2, 2),
    ]
    assert stand_in.requests[0].sampling.stop_token_ids == tuple(stop_token_ids(tok))
    # Events: one report per step, weights announced by the weight-server (not twice), then done.
    assert [(s.step, s.weight_version) for s in events["steps"]] == [(0, 1), (1, 2)]
    # On-policy GRPO's loss value is 0 (ratios are exactly 1, advantages sum to 0 per group); its gradient is not.
    assert all(s.reward_mean == 0.5 and s.tokens > 0 and s.grad_norm > 0 for s in events["steps"])
    assert all(s.entropy > 0 and s.kl == 0.0 and s.ranks == 1 and s.off_policy == 0 for s in events["steps"])
    assert all(s.trainer_idle_seconds >= 0 and s.train_compute_seconds > 0 for s in events["steps"])
    assert sorted(w.version for w in events["weights"]) == [0, 1, 2]
    assert events["done"] == [JobDone(ok=True, steps=2, final_weights_checksum=final)]
    assert events["steps"][-1].weights_checksum == final != v0
    # Debug outputs: one line per step, one line per trajectory with the tokens the manager sent.
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert [StepReport.model_validate_json(x) for x in lines] == events["steps"]  # one record, file and event
    dumped = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [(d["step"], d["prompt_index"], d["sample_index"], d["token_ids"]) for d in dumped] == [
        (t.step, t.prompt_index, t.sample_index, t.response_ids) for t in stand_in.sent
    ]
    # Metrics after step 0: version 1 published, reward 0.5, a gradient, every phase timed.
    assert scraped["rlboost_trainer_weight_version"] == 1.0 and scraped["rlboost_trainer_reward_mean"] == 0.5
    assert scraped["rlboost_trainer_grad_norm"] > 0 and scraped["rlboost_trainer_learning_rate"] == 1e-2
    assert all(scraped[f'rlboost_trainer_step_seconds{{phase="{p}"}}'] > 0 for p in ("rollout", "train", "sync"))
    assert {name: scraped[name] for name, _ in step_gauges().values()} == {
        name: getattr(events["steps"][0], field) for field, (name, _) in step_gauges().items()
    }


async def _scrape_after_step0(port: int, proc) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:

        async def step_done() -> dict[str, float] | None:
            if proc.returncode is not None:
                raise AssertionError(f"trainer exited early with {proc.returncode}")
            try:
                if (await http.get("/healthz")).status_code != 200:
                    return None
                text = (await http.get("/metrics")).text
            except httpx.TransportError:
                return None  # not listening yet
            values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
            got = {k: float(v) for k, v in values.items()}
            return got if got.get("rlboost_trainer_step") == 1.0 else None

        return await wait_for(step_done, 180, "trainer /metrics to show step 0 done")


@pytest.mark.slow
async def test_manager_failure_publishes_job_done_not_ok_and_exits_nonzero(tmp_path, tiny_model_dir, nats_server):
    config, tok = _setup(tmp_path, tiny_model_dir)
    stand_in = StandInManager(tok, stop_token_ids(tok)[0], fail_at_step=0)
    code, err, events = await run_trainer(tmp_path, config, stand_in, nats_server.url, "tf", steps=2)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlboost serve trainer: failed: RolloutError:") and "no workers left" in last
    assert len(events["done"]) == 1 and not events["done"][0].ok and events["done"][0].steps == 0
    assert "no workers left" in events["done"][0].error
