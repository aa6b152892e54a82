"""The colocation part of the engine contract, for every backend (see test_engine_contract.py for how the
sglang parameter runs): release refuses work until resume, and greedy output after resume equals before.
On CPU SGLang's release is a logged no-op (`effective=False`; it needs CUDA and the memory saver)."""

from __future__ import annotations

import pytest
import pytest_asyncio

from rollout_worker.engine.base import EngineError
from tests.rollout_worker.engine_helpers import assignment, collect, started_engine
from tests.rollout_worker.test_engine_contract import BACKENDS, PROMPT

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def engine(request, tiny_model_dir):
    async with started_engine(request.param, tiny_model_dir, capacity=4) as eng:
        yield eng


async def test_release_refuses_work_and_resume_generates_the_same(engine):
    before, _, _, _ = await collect(engine, assignment("before", PROMPT, len(PROMPT), n=10))
    checksum = engine.weights_checksum
    released = await engine.release_memory()
    assert engine.memory_released and released.action == "release"
    with pytest.raises(EngineError, match="memory is released"):
        await anext(engine.generate(assignment("during", PROMPT, len(PROMPT))))
    resumed = await engine.resume_memory()
    assert not engine.memory_released and resumed.action == "resume"
    assert engine.weights_checksum == checksum
    after, _, _, _ = await collect(engine, assignment("after", PROMPT, len(PROMPT), n=10))
    assert after == before


async def test_a_hold_refuses_work_until_resume_which_then_frees_and_restores_nothing(engine):
    """hold_for_release() is the release's first step (the worker's heartbeats say released from there on);
    resume_memory() after a hold alone only takes work again."""
    engine.hold_for_release()
    assert engine.memory_released
    with pytest.raises(EngineError, match="memory is released"):
        await anext(engine.generate(assignment("held", PROMPT, len(PROMPT))))
    resumed = await engine.resume_memory()
    assert not engine.memory_released and (resumed.nbytes, resumed.effective) == (0, False)
    tokens, _, _, _ = await collect(engine, assignment("after-hold", PROMPT, len(PROMPT), n=4))
    assert len(tokens) == 4
