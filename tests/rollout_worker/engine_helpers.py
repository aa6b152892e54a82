"""Shared helpers of the rollout-worker engine tests: build assignments, collect streams, reference decode."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import torch
from transformers import AutoModelForCausalLM

from rlboost.wire.rollout_io import Assignment, SamplingParams
from rollout_worker.engine import make_engine
from rollout_worker.engine.base import Engine


@contextlib.asynccontextmanager
async def started_engine(backend: str, model_dir, capacity: int) -> AsyncIterator[Engine]:
    """A started engine of `backend` on the model, closed on exit."""
    eng = make_engine(backend, capacity=capacity)
    if backend == "sglang":
        # Small KV pool: the tiny model needs a few thousand token slots, not a share of the host's RAM.
        eng.extra_args.update({"max_total_tokens": 8192, "context_length": 1024})
    await eng.start(str(model_dir))
    try:
        yield eng
    finally:
        await eng.close()


def assignment(rid: str, input_ids: list[int], prompt_len: int, n: int = 12, temp: float = 0.0, seed: int = 7, stop=()):
    sampling = SamplingParams(temperature=temp, max_new_tokens=n, seed=seed, stop_token_ids=tuple(stop))
    return Assignment(rid, 1, list(input_ids), prompt_len, sampling, 0)


async def collect(engine: Engine, a: Assignment, abort_after: int = 0) -> tuple[list[int], list[float], str, list]:
    tokens, logprobs, steps = [], [], []
    async for step in engine.generate(a):
        assert step.offset == a.generated + len(tokens), "steps must be contiguous response indices"
        assert len(step.token_ids) == len(step.logprobs), "one log-probability per token"
        tokens += step.token_ids
        logprobs += step.logprobs
        steps.append(step)
        if abort_after and len(tokens) >= abort_after and not step.finished:
            assert engine.abort(a.request_id)
            abort_after = 0
    assert steps and steps[-1].finished and all(not s.finished for s in steps[:-1])
    return tokens, logprobs, steps[-1].finish_reason, steps


def hf_greedy(model_dir, prompt: list[int], n: int, state=None) -> list[int]:
    """transformers' own greedy decode in float32, with `state` (bf16 tensors) loaded when given."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if state is not None:
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True, eos_token_id=None
    )
    return out[0, len(prompt) :].tolist()
