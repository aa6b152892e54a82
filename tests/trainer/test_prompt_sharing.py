"""Shared prompts (trainer.prompt_sharing) against the plain forward, on a real tiny Qwen3 (transformers, CPU): the
same log-probs and the same gradient, for prompts of several lengths, groups of several sizes, responses of several
lengths and an agentic episode's masked environment tokens."""

from __future__ import annotations

import pytest
import torch

from rlboost.wire.rollout_io import Trajectory
from tests.trainer.conftest import tiny_spec
from trainer import prompt_sharing
from trainer.grpo import Sample, collate, token_logprobs

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

# (prompt, [(response, loss mask or None), ...]): three distinct prompts, two of one length; groups of 3, 2 and 1.
GROUPS = [
    ([5, 9, 12, 7], [([20, 21, 22], None), ([23], None), ([24, 25, 26, 27], None)]),
    ([8, 6, 11, 13, 14, 15], [([30, 31], None), ([32, 33, 34, 35], bytes([1, 0, 0, 1]))]),
    ([8, 6, 11, 13, 14, 16], [([40, 41, 42], None)]),
]


def _batch():
    samples = []
    for p, (prompt, responses) in enumerate(GROUPS):
        for s, (response, loss_mask) in enumerate(responses):
            t = Trajectory(f"s0-p{p}-g{s}", 0, p, s, prompt, response, [], "length", 0, loss_mask=loss_mask or b"")
            samples.append(Sample(t, reward=0.0, advantage=1.0))
    return collate(samples, pad_id=0)


def _model(tiny_model_dir, attention: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, attn_implementation=attention
    )
    with torch.no_grad():  # random weights: a freshly made tiny model's are nearly uniform
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return model


@pytest.mark.parametrize("how", ["packed", "packed-eager", "cached"])
def test_shared_prompts_give_the_plain_forwards_log_probs_and_gradient(tiny_model_dir, how, monkeypatch):
    """Packed in one pass (SDPA's boolean mask, eager attention's additive one) and in two passes over a KV cache
    (a micro-batch past PACK_MAX_MASK)."""
    model, batch = _model(tiny_model_dir, "eager" if how == "packed-eager" else "sdpa"), _batch()
    if how == "cached":
        monkeypatch.setattr(prompt_sharing, "PACK_MAX_MASK", 0)
    weights = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))

    plain = token_logprobs(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.input_ids, 0.7
    )
    (plain * batch.loss_mask() * weights).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    shared = prompt_sharing.plan(batch)
    assert shared is not None and shared.prompts.shape[0] == 3 and shared.of_row.tolist() == [0, 0, 0, 1, 1, 2]
    assert (prompt_sharing.pack(shared) is None) == (how == "cached")
    view = prompt_sharing.view(batch, shared)
    logp = token_logprobs(prompt_sharing.forward(model, shared), view.input_ids, 0.7)
    columns = prompt_sharing.view(batch.__class__(**{**vars(batch), "response_mask": weights}), shared).response_mask
    (logp * view.loss_mask() * columns).sum().backward()

    back = prompt_sharing.to_targets(logp.detach(), shared, batch.response_mask.shape[1])
    on = batch.response_mask > 0
    assert torch.allclose(back[on], plain.detach()[on], atol=1e-5)
    assert view.num_tokens == batch.num_tokens == 15  # every loss token kept, the environment's two left out
    for mine, want in zip((p.grad for p in model.parameters()), plain_grads, strict=True):
        assert torch.allclose(mine, want, rtol=1e-4, atol=1e-6)


def test_the_packed_rows_hold_each_prompt_then_its_responses_each_seeing_its_prompt_and_itself():
    shared = prompt_sharing.plan(_batch())
    packed = prompt_sharing.pack(shared)
    assert packed is not None and packed.input_ids.shape == (3, 12)  # the longest: 4 + 3 + 1 + 4
    assert packed.input_ids[0].tolist() == [5, 9, 12, 7, 20, 21, 22, 23, 24, 25, 26, 27]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 4, 4, 5, 6, 7]  # each response after the prompt
    assert packed.input_ids[2, :9].tolist() == [8, 6, 11, 13, 14, 16, 40, 41, 42]
    sees = packed.mask[0, 0]
    assert sees[8].tolist() == [True] * 4 + [False] * 4 + [True] + [False] * 3  # response 3's first token
    assert sees[3].tolist() == [True] * 4 + [False] * 8  # the prompt sees only itself, causally
    assert sees[11, 8:].all() and not sees[11, 4:8].any()
    assert packed.mask[2, 0, 10:, 10:].equal(torch.eye(2, dtype=torch.bool))  # padding sees only itself
    logit_at = packed.logit_at.reshape(6, -1)  # response coordinates: [the prompt's last, after each token...]
    assert logit_at[2].tolist() == [3, 8, 9, 10, 11] and logit_at[1].tolist() == [3, 7, 3, 3, 3]


def test_no_sharing_without_a_repeated_prompt():
    batch = _batch()
    distinct = batch.__class__(**{**vars(batch), "prompt_lengths": torch.tensor([4, 3, 2, 6, 5, 6])})
    assert prompt_sharing.plan(distinct) is None  # every row's prompt differs: a plain forward
    assert prompt_sharing.plan(batch.__class__(**{**vars(batch), "prompt_lengths": None})) is None


def test_the_engine_trains_on_shared_prompts_as_on_whole_rows(tiny_model_dir):
    """Two real DeepSpeed engines on one batch, prompts shared and not: the same log-probs, loss and statistics."""
    from trainer.engine import PolicyEngine

    results = []
    for share in (True, False):
        spec = tiny_spec(micro_batch_size=6, entropy_coef=0.01)
        spec.trainer.share_prompts = share
        engine = PolicyEngine(tiny_model_dir, spec)
        with torch.no_grad():
            logp = engine.logprobs(_batch())
        loss, stats = engine.forward_backward(_batch(), 6)
        results.append((logp * (_batch().response_mask > 0), loss, stats))
    (shared_logp, shared_loss, shared_stats), (logp, loss, stats) = results
    assert torch.allclose(shared_logp, logp, atol=1e-5)
    assert shared_loss == pytest.approx(loss, abs=1e-6) and shared_stats.tokens == stats.tokens == 15
    assert shared_stats.entropy_sum == pytest.approx(stats.entropy_sum, rel=1e-5)


# A micro-batch of the default job (step 1): 3 distinct prompts (two groups share one), 2-token responses.
DEFAULT_JOB_PROMPTS = [
    [1, 278, 201, 280, 279, 223, 18, 13, 21, 33, 2, 201, 1, 282, 201],
    [1, 278, 201, 280, 279, 223, 20, 13, 19, 33, 2, 201, 1, 282, 201],
    [1, 278, 201, 280, 279, 223, 22, 13, 23, 33, 2, 201, 1, 282, 201],
]
DEFAULT_JOB_ANSWERS = [21, 23, 23] + [22] * 17 + [21, 22, 21, 22, 26, 25, 26, 25, 25, 26, 27, 26]


def test_the_default_jobs_gradient_is_the_same_on_one_and_two_threads(tmp_path):
    """On the default job's model (vocabulary 283), an LM head over 3 rows (one per distinct prompt) gave other bits
    on 1 and 2 threads here (the default job then ended on other weights with a 2-thread trainer); over every row,
    at least 4 (`head_rows`), it does not. In a process of its own, with the trainer's CPU arithmetic
    (rlboost.cpu_numerics: AVX2 kernels, which must be chosen before torch loads)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from rlboost.cpu_numerics import CPU_NUMERICS_ENV, ROW_ORDER_VARIES, batch_invariant

    if not batch_invariant():
        pytest.skip(ROW_ORDER_VARIES)
    code = f"from tests.trainer.test_prompt_sharing import gradients_alike; print(gradients_alike({str(tmp_path)!r}))"
    env = {**os.environ, **CPU_NUMERICS_ENV}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr[-2000:]


def gradients_alike(tmp: str) -> bool:
    """Whether the default job's micro-batch above gives the same gradient on 1 and 2 threads (shared prompts)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    from rlboost.models import ensure_model
    from rlboost.spec import JobSpec

    spec = JobSpec()
    model = AutoModelForCausalLM.from_pretrained(str(ensure_model(spec.model, spec.task, Path(tmp) / "model")))
    rows = []
    for i, answer in enumerate(DEFAULT_JOB_ANSWERS):
        p = 0 if i < 8 else 1 if i < 24 else 2
        t = Trajectory(f"s1-{i}", 1, p, i, DEFAULT_JOB_PROMPTS[p], [answer, 2], [], "stop", 1)
        rows.append(Sample(t, reward=0.0, advantage=1.0))
    batch = collate(rows, pad_id=0)
    shared = prompt_sharing.plan(batch)
    view = prompt_sharing.view(batch, shared)
    grads = []
    for n in (1, 2):
        torch.set_num_threads(n)
        model.zero_grad()
        logp = token_logprobs(prompt_sharing.forward(model, shared), view.input_ids, 1.0, where=view.loss_mask() > 0)
        logp.sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
