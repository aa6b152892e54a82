"""The torch engine's shared prefill on a tiny real Qwen3 model: rows of a cohort with the same input ids (a GRPO
group's samples) are prefilled once and generate exactly what a prefill of every row does.

The reference is the same engine with sharing turned off (`_shared_rows` patched to give every row its own), so the
comparison is bit for bit: tokens and log-probabilities equal, not close. On one torch thread, as `rlboost local`
runs its workers: with several, how a product's rows are split across threads depends on the row count, and a
row's last bits with it (2.7e-06 apart here, for a shared and an unshared prefill alike)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from prometheus_client import REGISTRY

from rlboost.cpu_numerics import ROW_ORDER_VARIES, batch_invariant
from rollout_worker.engine import torch_engine
from rollout_worker.engine.torch_engine import TorchEngine
from tests.rollout_worker.engine_helpers import assignment, collect

GROUPS = {
    "three prompts": [[5, 9, 3, 17, 8], [3, 4], [10, 11, 12, 13, 14, 15, 16, 17]],  # padded to different widths
    "one prompt": [[5, 9, 3, 17, 8]],  # a single row computed: the LM head still runs over every row
}
SAMPLES = 4


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _shared_rows_total() -> float:
    return REGISTRY.get_sample_value("rlboost_worker_prefill_shared_rows_total") or 0.0


async def _group_run(model_dir, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """Every sample of every prompt submitted at once (one cohort), samples interleaved across prompts, each with
    its own seed at temperature 1 so the samples of a prompt differ."""
    eng = TorchEngine(capacity=len(prompts) * SAMPLES)
    await eng.start(str(model_dir))
    try:
        jobs = [
            collect(eng, assignment(f"p{p}-g{g}", prompt, len(prompt), n=10, temp=1.0, seed=100 * p + g))
            for g in range(SAMPLES)
            for p, prompt in enumerate(prompts)
        ]
        return [(tokens, logprobs) for tokens, logprobs, _, _ in await asyncio.gather(*jobs)]
    finally:
        await eng.close()


@pytest.mark.parametrize("name", list(GROUPS))
async def test_shared_prefill_equals_a_prefill_of_every_row(tiny_model_dir, monkeypatch, one_thread, name):
    if name == "one prompt" and not batch_invariant():  # a product over 1 row against one over 4
        pytest.skip(ROW_ORDER_VARIES)
    prompts = GROUPS[name]
    before = _shared_rows_total()
    shared = await _group_run(tiny_model_dir, prompts)
    assert _shared_rows_total() - before == len(prompts) * (SAMPLES - 1)  # one cohort, one row per prompt computed
    with monkeypatch.context() as m:
        m.setattr(torch_engine, "_shared_rows", lambda inputs: (inputs, list(range(len(inputs)))))
        unshared = await _group_run(tiny_model_dir, prompts)
    assert _shared_rows_total() - before == len(prompts) * (SAMPLES - 1)  # the reference shared nothing
    assert shared == unshared
    assert len({tuple(tokens) for tokens, _ in shared}) > len(prompts)  # the samples of a prompt differ


def test_shared_rows_maps_each_input_to_its_first_occurrence():
    unique, rows = torch_engine._shared_rows([[1, 2], [3], [1, 2], [1, 2, 0], [3]])
    assert unique == [[1, 2], [3], [1, 2, 0]]
    assert rows == [0, 1, 0, 2, 1]
