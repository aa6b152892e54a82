"""The torch engine on a tiny real Qwen3 model: streaming, abort, continuation, batching, weight updates."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlboost.weights.checksum import state_checksum
from rollout_worker.engine.base import FINISH_ABORT, FINISH_LENGTH, FINISH_STOP, EngineError, read_model_state
from rollout_worker.engine.torch_engine import TorchEngine
from tests.rollout_worker.engine_helpers import assignment, collect, hf_greedy

PROMPT = [5, 9, 3, 17, 8]


@pytest.fixture
async def engine(tiny_model_dir):
    eng = TorchEngine(capacity=8)
    await eng.start(str(tiny_model_dir))
    yield eng
    await eng.close()


async def test_greedy_equals_transformers_generate(engine, tiny_model_dir):
    tokens, logprobs, reason, _ = await collect(engine, assignment("r", PROMPT, len(PROMPT), n=16))
    assert tokens == hf_greedy(tiny_model_dir, PROMPT, 16)
    assert reason == FINISH_LENGTH
    assert len(logprobs) == 16 and all(lp <= 0 for lp in logprobs)


@pytest.mark.parametrize("temp", [0.0, 1.0])
async def test_continuation_is_token_exact(engine, temp):
    """A request continued from prompt + its first k tokens yields what the uninterrupted run did."""
    full, full_lp, _, _ = await collect(engine, assignment("a", PROMPT, len(PROMPT), n=14, temp=temp, seed=11))
    for k in (1, 6, 13):
        rest, rest_lp, reason, _ = await collect(
            engine, assignment(f"c{k}", PROMPT + full[:k], len(PROMPT), n=14, temp=temp, seed=11)
        )
        assert full[:k] + rest == full
        assert rest_lp == pytest.approx(full_lp[k:], abs=1e-4)
        assert reason == FINISH_LENGTH


async def test_sampling_depends_on_seed(engine):
    a, _, _, _ = await collect(engine, assignment("a", PROMPT, len(PROMPT), n=14, temp=1.0, seed=1))
    b, _, _, _ = await collect(engine, assignment("b", PROMPT, len(PROMPT), n=14, temp=1.0, seed=2))
    assert a != b


async def test_batched_requests_match_solo_runs(engine):
    """Requests of different lengths decoding together, and a cohort joining mid-decode, match their solo runs."""
    prompts = [PROMPT, [3, 4], [10, 11, 12, 13, 14, 15, 16, 17], [40, 41, 42]]
    solo = [(await collect(engine, assignment(f"s{i}", p, len(p), temp=1.0, seed=i)))[0] for i, p in enumerate(prompts)]
    streams = [engine.generate(assignment(f"b{i}", p, len(p), temp=1.0, seed=i)) for i, p in enumerate(prompts[:2])]
    heads = await asyncio.gather(*(anext(s) for s in streams))  # the first cohort is decoding now
    later = [collect(engine, assignment(f"b{i}", p, len(p), temp=1.0, seed=i)) for i, p in enumerate(prompts[2:], 2)]

    async def rest(head, stream) -> list[int]:
        return head.token_ids + [t async for step in stream for t in step.token_ids]

    firsts = await asyncio.gather(*(rest(h, s) for h, s in zip(heads, streams, strict=True)), *later)
    batched = list(firsts[:2]) + [r[0] for r in firsts[2:]]
    assert batched == solo


async def test_stop_token_ends_and_is_emitted(engine):
    full, _, _, _ = await collect(engine, assignment("a", PROMPT, len(PROMPT), n=12))
    stop = full[4]
    tokens, _, reason, _ = await collect(engine, assignment("b", PROMPT, len(PROMPT), n=12, stop=[stop]))
    assert tokens == full[: full.index(stop) + 1]
    assert reason == FINISH_STOP


async def test_max_new_tokens_counts_tokens_generated_before(engine):
    full, _, _, _ = await collect(engine, assignment("a", PROMPT, len(PROMPT), n=10))
    rest, _, reason, _ = await collect(engine, assignment("b", PROMPT + full[:7], len(PROMPT), n=10))
    assert rest == full[7:10] and reason == FINISH_LENGTH
    done, _, reason, steps = await collect(engine, assignment("c", PROMPT + full, len(PROMPT), n=10))
    assert done == [] and reason == FINISH_LENGTH and steps[-1].finished


async def test_abort_stops_at_once_and_keeps_what_was_produced(engine):
    a = assignment("r", PROMPT, len(PROMPT), n=200)
    tokens: list[int] = []
    last = None
    async for step in engine.generate(a):
        tokens += step.token_ids
        last = step
        if len(tokens) >= 3 and not step.finished:
            assert engine.abort("r")
    assert last.finished and last.finish_reason == FINISH_ABORT
    assert 3 <= len(tokens) < 200
    assert engine.running == 0
    assert not engine.abort("r"), "aborting a finished request reports False"


async def test_update_weights_in_place_matches_fresh_model(engine, tiny_model_dir):
    old = read_model_state(str(tiny_model_dir))
    gen = torch.Generator().manual_seed(3)
    new = {k: (v.float() + 0.2 * torch.randn(v.shape, generator=gen)).to(torch.bfloat16) for k, v in old.items()}
    before, _, _, _ = await collect(engine, assignment("a", PROMPT, len(PROMPT), n=12))
    await engine.update_weights(new, 5)
    assert engine.weight_version == 5
    assert engine.weights_checksum == state_checksum(new)
    after, _, _, _ = await collect(engine, assignment("b", PROMPT, len(PROMPT), n=12))
    assert after == hf_greedy(tiny_model_dir, PROMPT, 12, state=new)
    assert after != before


async def test_a_verified_checksum_passed_in_is_reported_without_hashing_the_state_again(
    engine, tiny_model_dir, monkeypatch
):
    """The weight puller has verified the state's checksum already: the engine takes it as given. The engine's
    own state_checksum is replaced by one that fails (a spy, not a stand-in) to show the state is not re-read."""
    import rollout_worker.engine.torch_engine as te

    new = {k: (v.float() * 0.5).to(torch.bfloat16) for k, v in read_model_state(str(tiny_model_dir)).items()}
    verified = state_checksum(new)

    def _no_rehash(state):
        raise AssertionError("the engine hashed a state whose checksum it was given")

    monkeypatch.setattr(te, "state_checksum", _no_rehash)
    await engine.update_weights(new, 4, checksum=verified)
    assert engine.weight_version == 4 and engine.weights_checksum == verified
    monkeypatch.undo()
    await engine.update_weights(read_model_state(str(tiny_model_dir)), 0)  # without one: computed by the engine
    assert engine.weights_checksum == state_checksum(read_model_state(str(tiny_model_dir)))


async def test_update_waits_for_requests_of_the_old_version(engine, tiny_model_dir):
    """A request decoding when the update arrives finishes on the old weights; the update follows it."""
    old = read_model_state(str(tiny_model_dir))
    new = {k: (v.float() * 1.5).to(torch.bfloat16) for k, v in old.items()}
    reference, _, _, _ = await collect(engine, assignment("ref", PROMPT, len(PROMPT), n=30))
    stream = engine.generate(assignment("r", PROMPT, len(PROMPT), n=30))
    first = await anext(stream)
    update = asyncio.create_task(engine.update_weights(new, 1))
    tokens = list(first.token_ids)
    async for step in stream:
        tokens += step.token_ids
        assert not update.done() or step.finished, "weights must not change while the old request decodes"
    await asyncio.wait_for(update, 10)
    assert tokens == reference
    assert engine.weight_version == 1


async def test_bad_weights_are_refused_with_the_tensor_named(engine):
    with pytest.raises(EngineError, match="not in the model"):
        await engine.update_weights({"nonsense.weight": torch.zeros(2)}, 1)
    assert engine.weight_version == 0


async def test_model_dir_that_does_not_load(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineError, match="cannot load a model"):
        await TorchEngine().start(str(tmp_path))
