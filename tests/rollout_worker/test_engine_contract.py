"""One behaviour contract for every rollout engine, parametrised over the `torch` and `sglang` backends.

Each backend runs a real engine on the tiny Qwen3 model (conftest.tiny_model_dir) and is held to the same
behaviour: streamed chunks at contiguous offsets, greedy output equal to transformers, abort of one
request while another continues, continuation from prompt + tokens equal to the uninterrupted run, stop
ids, and greedy output after an in-place weight update (full and sparse delta) equal to transformers
with the new weights, and a start from the pulled assets alone (a spot worker: no weights on disk) that takes
its first state as an ordinary, verified update.

The sglang parameter needs SGLang importable (CPU: `scripts/setup_sglang_env.sh`, then
`.venv-sglang/bin/python -m pytest -m sglang tests/rollout_worker/test_engine_contract.py`); it is skipped
elsewhere. One engine per backend serves the whole module (SGLang takes ~15 s to start on CPU).
"""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest
import pytest_asyncio
import torch

from rlboost.models.layout import asset_files
from rlboost.weights.checksum import state_checksum
from rollout_worker.engine.base import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, EngineError, read_model_state
from tests.rollout_worker.engine_helpers import assignment, collect, hf_greedy, started_engine

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = [5, 9, 3, 17, 8]


def _sglang_skip_reason() -> str:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from rollout_worker.engine.sglang_engine import sglang_available

    reason = sglang_available()
    return f"{reason} (build .venv-sglang with scripts/setup_sglang_env.sh: make test-sglang)" if reason else ""


_SGLANG_SKIP = _sglang_skip_reason()
BACKENDS = [
    "torch",
    pytest.param(
        "sglang",
        marks=[
            pytest.mark.sglang,
            pytest.mark.skipif(bool(_SGLANG_SKIP), reason=_SGLANG_SKIP or "n/a"),
            # SGLang's own import and start-up warn (torch.jit deprecations, "GGUF needs CUDA", ...): not ours.
            pytest.mark.filterwarnings("ignore::DeprecationWarning"),
            pytest.mark.filterwarnings("ignore::UserWarning"),
            pytest.mark.filterwarnings("ignore::FutureWarning"),
        ],
    ),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def engine(request, tiny_model_dir):
    async with started_engine(request.param, tiny_model_dir, capacity=8) as eng:
        yield eng


async def test_streams_greedy_tokens_equal_to_transformers(engine, tiny_model_dir):
    tokens, logprobs, reason, steps = await collect(engine, assignment("stream", PROMPT, len(PROMPT), n=16))
    assert tokens == hf_greedy(tiny_model_dir, PROMPT, 16)
    assert reason == FINISH_LENGTH
    assert sum(1 for s in steps if s.token_ids) > 1, "tokens must stream in several chunks, not one at the end"
    assert len(logprobs) == 16 and all(lp <= 0 for lp in logprobs)


async def test_abort_one_request_leaves_the_other_running(engine):
    solo, _, _, _ = await collect(engine, assignment("solo", [3, 4, 5], 3, n=24))
    victim = asyncio.create_task(collect(engine, assignment("victim", PROMPT, len(PROMPT), n=400), abort_after=3))
    other = asyncio.create_task(collect(engine, assignment("other", [3, 4, 5], 3, n=24)))
    (v_tokens, _, v_reason, _), (o_tokens, _, o_reason, _) = await asyncio.wait_for(asyncio.gather(victim, other), 60)
    assert v_reason == FINISH_ABORT and 3 <= len(v_tokens) < 400
    assert o_reason == FINISH_LENGTH and o_tokens == solo
    assert engine.running == 0
    assert not engine.abort("victim"), "aborting a finished request reports False"


@pytest.mark.parametrize("temp", [0.0, 1.0])
async def test_continuation_from_prompt_plus_tokens_equals_uninterrupted(engine, temp):
    """A request continued from prompt + its first k tokens yields what the uninterrupted run did."""
    if temp > 0 and not getattr(engine, "seeded_sampling", True):
        pytest.skip(f"{engine.name} on {engine.device}: no reproducible seeded sampling (greedy only)")
    full, full_lp, _, _ = await collect(
        engine, assignment(f"full{temp}", PROMPT, len(PROMPT), n=14, temp=temp, seed=11)
    )
    for k in (1, 6, 13):
        rest, rest_lp, reason, _ = await collect(
            engine, assignment(f"cont{temp}-{k}", PROMPT + full[:k], len(PROMPT), n=14, temp=temp, seed=11)
        )
        assert full[:k] + rest == full
        assert rest_lp == pytest.approx(full_lp[k:], abs=1e-3)
        assert reason == FINISH_LENGTH
    done, _, reason, _ = await collect(engine, assignment(f"done{temp}", PROMPT + full, len(PROMPT), n=14))
    assert done == [] and reason == FINISH_LENGTH


async def test_stop_token_ends_the_response_and_is_emitted(engine):
    full, _, _, _ = await collect(engine, assignment("nostop", PROMPT, len(PROMPT), n=12))
    stop = full[4]
    tokens, _, reason, _ = await collect(engine, assignment("stop", PROMPT, len(PROMPT), n=12, stop=[stop]))
    assert tokens == full[: full.index(stop) + 1]
    assert reason == FINISH_STOP


async def test_a_published_state_naming_both_tied_embeddings_applies(engine, tiny_model_dir):
    """The trainer publishes `state_dict()`: a tied model's lm_head.weight beside embed_tokens (same bits)."""
    state = read_model_state(str(tiny_model_dir))
    assert "lm_head.weight" not in state  # the files store the tied pair once
    published = {**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}
    await engine.update_weights(published, 7)
    assert engine.weight_version == 7 and engine.weights_checksum == state_checksum(published)
    await engine.update_weights(state, 0)  # back to the files' weights for the tests after this one


async def test_greedy_after_weight_updates_equals_transformers_with_new_weights(engine, tiny_model_dir):
    old = read_model_state(str(tiny_model_dir))
    gen = torch.Generator().manual_seed(3)
    full = {k: (v.float() + 0.2 * torch.randn(v.shape, generator=gen)).to(torch.bfloat16) for k, v in old.items()}
    before, _, _, _ = await collect(engine, assignment("before", PROMPT, len(PROMPT), n=12))
    try:
        await engine.update_weights(full, 5)
        assert engine.weight_version == 5 and engine.weights_checksum == state_checksum(full)
        after, _, _, _ = await collect(engine, assignment("after-full", PROMPT, len(PROMPT), n=12))
        assert after == hf_greedy(tiny_model_dir, PROMPT, 12, state=full)
        assert after != before

        # A sparse delta: one tensor changes (the rest are the very same tensors).
        name = next(k for k in full if k.endswith("mlp.down_proj.weight"))
        delta = dict(full)
        delta[name] = (full[name].float() * -3.0).to(torch.bfloat16)
        await engine.update_weights(delta, 6)
        assert engine.weight_version == 6 and engine.weights_checksum == state_checksum(delta)
        if hasattr(engine, "last_update"):
            assert engine.last_update["tensors"] == 1, "a delta must send only the tensors it changes"
        after_delta, _, _, _ = await collect(engine, assignment("after-delta", PROMPT, len(PROMPT), n=12))
        assert after_delta == hf_greedy(tiny_model_dir, PROMPT, 12, state=delta)
    finally:
        await engine.update_weights(old, 0)  # the module shares one engine: leave the original weights
    restored, _, _, _ = await collect(engine, assignment("restored", PROMPT, len(PROMPT), n=12))
    assert restored == before


@pytest.mark.parametrize("backend", BACKENDS)
async def test_an_engine_started_from_the_pulled_assets_alone_takes_its_weights_as_a_verified_update(
    backend, tiny_model_dir, tmp_path
):
    """A spot worker's model directory holds what it pulled from the weight-server's /v1/assets (config, no
    weights): the engine starts from the config, takes no request and no partial state before its first whole
    state, and with that (as the trainer publishes it) generates what transformers does with those weights."""
    pulled = tmp_path / "pulled"
    pulled.mkdir()
    for path in asset_files(tiny_model_dir):
        shutil.copy(path, pulled / path.name)
    assert not list(pulled.glob("*.safetensors"))
    files = read_model_state(str(tiny_model_dir))
    published = {**files, "lm_head.weight": files["model.embed_tokens.weight"].clone()}  # state_dict(): both
    async with started_engine(backend, pulled, capacity=2) as eng:
        with pytest.raises(EngineError, match="without weights"):
            await anext(eng.generate(assignment("too-early", PROMPT, len(PROMPT))))
        name = next(k for k in published if k.endswith("mlp.down_proj.weight"))
        with pytest.raises(EngineError, match="missing"):
            await eng.update_weights({name: published[name]}, 2)
        checksum = state_checksum(published)
        await eng.update_weights(published, 3, checksum=checksum)
        assert (eng.weight_version, eng.weights_checksum) == (3, checksum)
        tokens, _, reason, _ = await collect(eng, assignment("first", PROMPT, len(PROMPT), n=12))
        assert tokens == hf_greedy(tiny_model_dir, PROMPT, 12) and reason == FINISH_LENGTH


async def test_a_prompt_id_outside_the_vocabulary_is_refused_alone(engine):
    """Checked at admission: the bad request ends at once with the cause; one beside it runs as alone."""
    solo, _, _, _ = await collect(engine, assignment("alone", PROMPT, len(PROMPT), n=8))
    bad = [5, 9, 64, 3]  # the tiny model's vocabulary is 0..63
    (tokens, _, reason, steps), (good, _, _, _) = await asyncio.wait_for(
        asyncio.gather(
            collect(engine, assignment("bad", bad, len(bad))),
            collect(engine, assignment("beside", PROMPT, len(PROMPT), n=8)),
        ),
        60,
    )
    assert (tokens, reason, steps[-1].invalid_input) == ([], FINISH_ABORT, True)
    assert "input_ids[2] = 64 is outside the model's vocabulary (0..63)" in steps[-1].error
    assert good == solo and engine.running == 0
