"""A request that fails on a worker fails alone (issue 14, item 3): the torch engine refuses prompt ids outside
the vocabulary at admission, a batched step that fails is retried one request at a time so only the request at
fault ends (with the cause, for the manager), and a repeated error is one log line with a count.

The in-batch failure is a real one: a tiny GPT-2 (learned absolute positions, `n_positions=32`) fails with an
IndexError in its position embedding when a request passes position 31, in prefill or in decode.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest
import torch

from rollout_worker.engine.base import FINISH_ABORT, FINISH_LENGTH, RepeatedLog
from tests.rollout_worker.engine_helpers import assignment, collect, started_engine
from tests.rollout_worker.test_torch_engine import PROMPT

N_POSITIONS = 32


@pytest.fixture(scope="module")
def short_context_model_dir(tmp_path_factory):
    """A tiny GPT-2 with 32 positions, bf16 on disk."""
    from transformers import GPT2Config, GPT2LMHeadModel

    path = tmp_path_factory.mktemp("tiny-gpt2")
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64,
        n_positions=N_POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=2,
        initializer_range=0.3,
        bos_token_id=1,
        eos_token_id=2,
    )
    GPT2LMHeadModel(config).to(torch.bfloat16).save_pretrained(path)
    return path


@pytest.fixture
async def engine(tiny_model_dir):
    async with started_engine("torch", tiny_model_dir, capacity=8) as eng:
        yield eng


@pytest.fixture
async def short_engine(short_context_model_dir):
    async with started_engine("torch", short_context_model_dir, capacity=8) as eng:
        yield eng


def _lines(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


async def test_prompt_ids_outside_the_vocabulary_are_refused_alone_with_the_cause(engine, caplog):
    """The audit's case: one bad prompt among eight. It ends at once, naming the id and position; the seven
    others give exactly what they give alone; five refusals log one line."""
    solo, _, _, _ = await collect(engine, assignment("solo", PROMPT, len(PROMPT), n=12))
    bad_ids = {"bad-high": [5, 9, 64, 3], "bad-negative": [-1, 5, 9]}
    good = [assignment(f"good-{i}", PROMPT, len(PROMPT), n=12) for i in range(7)]
    bad = [assignment(rid, ids, len(ids), n=12) for rid, ids in bad_ids.items()]
    results = await asyncio.wait_for(asyncio.gather(*(collect(engine, a) for a in good + bad)), 60)
    for tokens, _, reason, _ in results[:7]:
        assert (tokens, reason) == (solo, FINISH_LENGTH)
    (high_tokens, _, high_reason, high_steps), (_, _, _, neg_steps) = results[7:]
    assert (high_tokens, high_reason) == ([], FINISH_ABORT)
    assert high_steps[-1].invalid_input
    assert "input_ids[2] = 64 is outside the model's vocabulary (0..63)" in high_steps[-1].error
    assert "input_ids[0] = -1" in neg_steps[-1].error and neg_steps[-1].invalid_input
    for i in range(3):
        await collect(engine, assignment(f"again-{i}", [70], 1))
    assert len(_lines(caplog, "outside the model's vocabulary")) == 1, "repeats are counted, not logged each"
    assert engine.running == 0


async def test_a_request_failing_in_a_batched_decode_step_fails_alone(short_engine, caplog):
    """'long' passes the model's last position mid-decode while three others decode beside it: the batch is
    retried one request at a time; the others finish exactly as alone, 'long' ends with the error after the
    tokens it made (every position the model has)."""
    short = [3, 4, 5, 6, 7]
    solo, _, _, _ = await collect(short_engine, assignment("solo", short, len(short), n=20))
    long_prompt = list(range(3, 23))
    others = [assignment(f"other-{i}", short, len(short), n=20) for i in range(3)]
    doomed = assignment("long", long_prompt, len(long_prompt), n=30)
    results = await asyncio.wait_for(asyncio.gather(*(collect(short_engine, a) for a in [*others, doomed])), 60)
    for tokens, _, reason, steps in results[:3]:
        assert (tokens, reason, steps[-1].error) == (solo, FINISH_LENGTH, "")
    tokens, _, reason, steps = results[3]
    assert reason == FINISH_ABORT and len(tokens) == N_POSITIONS - len(long_prompt) + 1
    assert "IndexError" in steps[-1].error and not steps[-1].invalid_input
    assert len(_lines(caplog, "a batch step failed (IndexError")) == 1
    assert short_engine.running == 0


async def test_a_request_failing_in_a_batched_prefill_fails_alone(short_engine, caplog):
    """A prompt longer than the model's positions, admitted with two others: they are prefilled again one by one."""
    short = [3, 4, 5, 6, 7]
    solo, _, _, _ = await collect(short_engine, assignment("solo", short, len(short), n=8))
    too_long = list(range(3, 3 + N_POSITIONS + 4))
    batch = [
        assignment("a", short, len(short), n=8),
        assignment("too-long", too_long, len(too_long)),
        assignment("b", short, len(short), n=8),
    ]
    a, doomed, b = await asyncio.wait_for(asyncio.gather(*(collect(short_engine, x) for x in batch)), 60)
    assert a[0] == solo and b[0] == solo
    assert doomed[0] == [] and doomed[2] == FINISH_ABORT and "IndexError" in doomed[3][-1].error
    assert len(_lines(caplog, "a batch step failed")) == 1, "the three were admitted as one batch"


def test_repeated_log_logs_once_per_period_with_the_count():
    """Pure logic with a hand-driven clock."""
    logger = logging.getLogger("test-repeated-log")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    now = [0.0]
    repeated = RepeatedLog(logger, period_s=10.0, clock=lambda: now[0])
    try:
        assert repeated.error("k", "boom")
        for t in range(1, 6):
            now[0] = float(t)
            assert not repeated.error("k", "boom")
        assert repeated.error("other", "bang"), "another key is logged at once"
        now[0] = 12.0
        assert repeated.error("k", "boom")
        assert [r.getMessage() for r in records] == ["boom", "bang", "boom (and 5 more like it in the last 12s)"]
        now[0] = 13.0
        repeated.error("k", "boom")
        repeated.flush()
        assert records[-1].getMessage() == "k: 1 more times"
    finally:
        logger.removeHandler(handler)


async def test_with_a_real_manager_seven_of_eight_are_delivered_and_the_bad_one_is_refused_with_its_cause(
    tiny_model_dir, tmp_path
):
    """The audit's run, as processes: `python -m rollout_manager` and `python -m rollout_worker` (torch), a Rollout
    of eight prompts, one with an id outside the vocabulary. The seven good trajectories arrive; the bad request
    is refused at admission each time the manager places it (what the manager does next is its own policy) and
    the worker's log holds the refusal once per period with a count, not once per placement."""
    import grpc
    import httpx

    from rlboost.nats_server import free_port, wait_for_port
    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
    from tests.rollout_worker.test_worker_process import spawn, stop, worker_argv

    mport, worker_metrics = free_port(), free_port()
    job = tmp_path / "job.yaml"  # drop, not fail (the default), so the step delivers the seven and the dropped one
    job.write_text("rollout: {onFailedRequest: drop}\n")
    argv = [
        sys.executable,
        "-m",
        "rollout_manager",
        "--port",
        str(mport),
        "--metrics-port",
        "0",
        "--nats-url",
        "",
        "--host",
        "127.0.0.1",
        "--config",
        str(job),
    ]
    manager = spawn(argv, tmp_path / "manager.log")
    worker = None
    try:
        await asyncio.to_thread(wait_for_port, "127.0.0.1", mport, 30, manager)
        worker = spawn(worker_argv(tiny_model_dir, mport, worker_metrics, capacity="8"), tmp_path / "worker.log")
        prompts = [pb.Prompt(prompt_index=i, token_ids=[5, 9, 3, 17 + i]) for i in range(8)]
        prompts[5].token_ids[2] = 64  # the tiny model's vocabulary is 0..63
        request = pb.RolloutRequest(
            step=0,
            weight_version=0,
            group_size=1,
            prompts=prompts,
            sampling=pb.SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=8, seed=1),
        )
        delivered: list[pb.Trajectory] = []

        async def seven() -> None:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{mport}") as ch:
                async for batch in pb_grpc.RolloutManagerStub(ch).Rollout(request):
                    delivered.extend(batch.trajectories)
                    if len(delivered) >= 8:
                        return

        await asyncio.wait_for(seven(), 120)
        good = [t for t in delivered if t.prompt_index != 5]
        assert sorted(t.prompt_index for t in good) == [0, 1, 2, 3, 4, 6, 7]
        assert all(len(t.response_ids) == 8 for t in good)
        assert [t.finish_reason for t in delivered if t.prompt_index == 5] == ["failed"]  # refused, dropped
        body = (await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{worker_metrics}/metrics")).text
        refused = _metric(body, 'rlboost_worker_request_errors_total{kind="invalid_input"}')
        assert refused >= 1
        log_lines = [line for line in (tmp_path / "worker.log").read_text().splitlines() if "vocabulary" in line]
        assert 1 <= len(log_lines) <= 1 + refused // 2, "refusals are logged once per period, with a count"
        assert "input_ids[2] = 64" in log_lines[0]
    finally:
        stop(worker, manager)


def _metric(body: str, name: str) -> float:
    line = next((line for line in body.splitlines() if line.startswith(name + " ")), f"{name} 0")
    return float(line.rsplit(" ", 1)[1])
