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


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with torch.no_grad():  # random weights: a freshly made tiny model's are nearly uniform
        for param in model.parameters():
            param.add_(0.2 * torch.randn_like(param))
    return model


def test_shared_prompts_give_the_plain_forwards_log_probs_and_gradient(tiny_model_dir):
    model, batch = _model(tiny_model_dir), _batch()
    weights = torch.rand(batch.response_mask.shape, generator=torch.Generator().manual_seed(1))

    plain = token_logprobs(
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch.input_ids, 0.7
    )
    (plain * batch.loss_mask() * weights).sum().backward()
    plain_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    shared = prompt_sharing.plan(batch)
    assert shared is not None and shared.prompts.shape[0] == 3 and shared.of_row.tolist() == [0, 0, 0, 1, 1, 2]
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
