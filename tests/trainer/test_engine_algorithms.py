"""The algorithm options through the real DeepSpeed engine (CPU, gloo, one rank) against a plain torch reference.

- 'token-mean' with streamed micro-batches: the step's normaliser T is known only at its optimizer step, where the
  accumulated gradient is rescaled (trainer.grad_scale). Two steps of micro-batches of 2 must give the update (and
  the pre-clip gradient norm) of one backward of TRL's 'dapo' loss over each whole step, then torch's clip and AdamW,
  on every ZeRO stage (each keeps its gradient elsewhere).
- algorithm.updatesPerStep 2: the second update's ratio is against the first pass's log-probs, computed once.
- the trainer/worker log-prob gap, and klInReward's per-row KL, on the engine's own forward.
"""

from __future__ import annotations

import pytest
import torch

from rlboost.wire.rollout_io import Trajectory
from tests.trainer import references as ref
from tests.trainer.conftest import tiny_spec
from trainer.grpo import MicroBatch, Sample, collate, token_logprobs

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.distributed.:FutureWarning"),
]


def _samples(lengths: list[int], seed: int) -> list[Sample]:
    """Four samples of two prompts with the given response lengths, advantages +-, no worker log-probs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        prompt = torch.randint(5, 60, (3 + i % 2,), generator=g).tolist()
        resp = torch.randint(5, 60, (n,), generator=g).tolist()
        t = Trajectory(f"s0-p{i // 2}-g{i % 2}", 0, i // 2, i % 2, prompt, resp, [], "stop", 0)
        out.append(Sample(t, reward=float(i % 2), advantage=1.5 if i % 2 else -1.0))
    return out


def _reference(model_dir, lr: float):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    return model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)


def _ref_logp(model, mb: MicroBatch) -> torch.Tensor:
    return token_logprobs(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits, mb.input_ids, 1.0)


def _ref_update(model, opt, mb: MicroBatch, old: torch.Tensor, clip: float = 0.2, max_norm: float = 1.0) -> float:
    """One update of TRL's dapo loss (grpo_trainer.py _compute_loss) over the whole batch, torch's clip, AdamW;
    returns the gradient norm before clipping."""
    opt.zero_grad()
    logp = _ref_logp(model, mb)
    per_token = ref.trl_per_token_loss(logp, old, mb.advantages, mb.response_mask, clip, clip)
    ref.trl_aggregate(per_token, mb.response_mask, "dapo").backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    opt.step()
    return float(norm)


def _assert_same_weights(engine, model) -> None:
    """The engine's weights are the reference's, but for a few elements whose gradient is near Adam's eps (1e-8):
    there m / (sqrt(v) + eps) turns the summation order's rounding into a visible difference (a few 1e-5)."""
    state, off, total = engine.full_state(), 0, 0
    for name, want in model.state_dict().items():
        diff = (state[name] - want).abs()
        assert float(diff.max()) < 5e-4, name  # the updates are about 2e-2 (lr 1e-2, two Adam steps)
        off, total = off + int((diff > 1e-5).sum()), total + diff.numel()
    assert off < total / 200, f"{off} of {total} weights differ by more than 1e-5"


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_token_mean_over_streamed_micro_batches_is_one_backward_of_the_steps_token_mean(tiny_model_dir, zero_stage):
    from trainer.engine import PolicyEngine

    spec = tiny_spec(loss_aggregation="token-mean", learning_rate=1e-2, micro_batch_size=2, grad_clip=1e6)
    spec.trainer.zero_stage = zero_stage
    engine = PolicyEngine(tiny_model_dir, spec)
    model, opt = _reference(tiny_model_dir, 1e-2)
    # T = 5 then 16 (N0 = 4 x 4 = 16): Adam's second update depends on the two steps' gradients' relative scale,
    # which the provisional normaliser would get wrong by 16 / 5 (unclipped: a clipped gradient hides any scale).
    for lengths, seed in (([1, 1, 2, 1], 1), ([4, 4, 4, 4], 2)):
        samples = _samples(lengths, seed)
        for part in (samples[:2], samples[2:]):
            engine.forward_backward(collate(part, pad_id=0), 4)
        result = engine.step()
        engine.end_step()
        whole = collate(samples, pad_id=0)
        with torch.no_grad():
            old = _ref_logp(model, whole)
        norm = _ref_update(model, opt, whole, old, max_norm=1e6)
        assert result.loss_scale == pytest.approx(16 / sum(lengths))
        if zero_stage > 0:  # ZeRO-0's plain optimizer reports no norm (DeepSpeed keeps none: NaN)
            assert result.grad_norm == pytest.approx(norm, rel=1e-4), "the norm must be taken after the rescale"
    _assert_same_weights(engine, model)


def test_two_updates_per_step_replay_against_the_first_pass_log_probs(tiny_model_dir):
    from trainer.training import StepTrainer

    spec = tiny_spec(loss_aggregation="token-mean", learning_rate=2e-2, micro_batch_size=2, updates_per_step=2)
    training = StepTrainer(tiny_model_dir, spec, pad_id=0)
    training.start()
    model, opt = _reference(tiny_model_dir, 2e-2)
    samples = _samples([2, 4, 3, 1], 3)
    loss, stats = 0.0, None
    for part in (samples[:2], samples[2:]):
        more_loss, more = training.engine.forward_backward(collate(part, pad_id=0), 4)
        loss, stats = loss + more_loss, more if stats is None else stats + more
    trained, _ = training.finish_step(loss, stats)
    whole = collate(samples, pad_id=0)
    with torch.no_grad():
        first = _ref_logp(model, whole)  # the old log-probs, computed once
    norms = [_ref_update(model, opt, whole, first), _ref_update(model, opt, whole, first)]
    _assert_same_weights(training.engine, model)
    assert trained.result.grad_norm == pytest.approx(sum(norms) / 2, rel=1e-4)
    # The first pass's ratios are exactly 1; the second's are not: both passes' tokens are in the statistics.
    assert trained.stats.tokens == 2 * 10 and trained.stats.ratio_sum != pytest.approx(20.0, abs=1e-6)
    assert training.engine.passes.replay == []  # forgotten once the step's updates are done


def test_the_gap_is_measured_against_the_workers_log_probs_on_the_first_pass(tiny_model_dir):
    from trainer.engine import PolicyEngine

    engine = PolicyEngine(tiny_model_dir, tiny_spec(micro_batch_size=4))
    samples = _samples([3, 3, 2, 1], 4)
    mb = collate(samples, pad_id=0)
    with torch.no_grad():
        logp = engine.logprobs(mb.to(engine.device))
    shifts = [0.01, -0.02, 0.0]  # the "worker" of sample 0 is off by these; the others report no log-probs
    p = len(samples[0].trajectory.prompt_ids)
    samples[0].trajectory.logprobs = [v + d for v, d in zip(logp[0, p - 1 : p + 2].tolist(), shifts, strict=True)]
    _, stats = engine.forward_backward(collate(samples, pad_id=0), 4)
    assert stats.mismatch_tokens == 3
    assert stats.mismatch_sum == pytest.approx(0.03, abs=1e-6) and stats.mismatch_max == pytest.approx(0.02, abs=1e-6)
    assert stats.abs_logp_diff_sum == 0.0  # the ratio's log is 0 on on-policy rows: it cannot show the gap


@pytest.mark.parametrize("source", ["trainer", "workers"])
def test_trainer_old_logprobs_score_stale_rows_under_the_published_weights_before_the_update(tiny_model_dir, source):
    """rolloutCorrection.oldLogprobs 'trainer': the step's update first keeps the weights as published (bf16), and
    the next step's stale rows take their log-probs under them as the old policy: whatever the workers reported, the
    loss is that of a plain model holding those bf16 weights. 'workers' (the default) takes the workers'."""
    from transformers import AutoModelForCausalLM

    from trainer.training import StepTrainer

    spec = tiny_spec(micro_batch_size=4, max_staleness=1, rollout_correction={"old_logprobs": source})
    training = StepTrainer(tiny_model_dir, spec, pad_id=0)
    training.start()
    engine = training.engine
    published = {k: v.to(torch.bfloat16).float() for k, v in engine.full_state().items()}
    loss, stats = engine.forward_backward(collate(_samples([2, 3, 1, 2], 6), pad_id=0), 4)
    training.finish_step(loss, stats)  # keeps the weights it updates from, then updates them
    sampler = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    sampler.load_state_dict(published, strict=False)  # the tied head follows the embedding

    def stale_loss(shift: float) -> float:
        samples = _samples([3, 2, 2, 1], 7)
        mb = collate(samples, pad_id=0)
        with torch.no_grad():
            under_sampler = token_logprobs(sampler(input_ids=mb.input_ids).logits, mb.input_ids, 1.0)
        for i, s in enumerate(samples):  # what "the workers" reported: the sampler's, off by `shift`
            p, n = len(s.trajectory.prompt_ids), len(s.trajectory.response_ids)
            s.trajectory.logprobs = [v + shift for v in under_sampler[i, p - 1 : p - 1 + n].tolist()]
            s.stale = True
        return engine.evaluate_loss(collate(samples, pad_id=0), 4)

    exact, off = stale_loss(0.0), stale_loss(0.3)
    if source == "trainer":
        assert off == pytest.approx(exact, abs=1e-6)  # the workers' numbers do not reach the loss
        engine.behaviour_kept = False  # as before any update: the workers' then, here the sampler's own
        assert stale_loss(0.0) == pytest.approx(exact, abs=1e-6)  # the kept weights are the sampler's
    else:
        assert abs(off - exact) > 1e-3  # they do: the test can tell the two apart
    assert exact != pytest.approx(engine.evaluate_loss(collate(_samples([3, 2, 2, 1], 7), pad_id=0), 4), abs=1e-6)


def test_kl_in_reward_sums_each_rows_kl_to_the_reference(tiny_model_dir):
    from trainer.engine import PolicyEngine

    spec = tiny_spec(kl_coef=0.5, kl_in_reward=True, kl_estimator="k3", learning_rate=5e-2, micro_batch_size=4)
    engine = PolicyEngine(tiny_model_dir, spec)
    samples = _samples([3, 2, 4, 1], 5)
    mb = collate(samples, pad_id=0)
    assert engine.sequence_kl(mb) == [0.0] * 4  # the policy is its reference before the first update
    loss, stats = engine.forward_backward(mb, 4)
    assert stats.kl_sum == 0.0  # klInReward: the loss has no KL term
    engine.step()
    kls = engine.sequence_kl(mb)
    with torch.no_grad():
        logp, ref_logp = engine.logprobs(mb), engine.reference_logprobs(mb)
    want = ref.verl_kl_penalty_forward(logp, ref_logp, "k3") * mb.loss_mask()
    assert kls == pytest.approx(want.sum(dim=1).tolist(), rel=1e-5) and all(k > 0 for k in kls)


def test_token_mean_refuses_an_optimizer_it_cannot_rescale_exactly(tiny_model_dir, monkeypatch):
    """ZeRO-0 with bf16 parameters (a GPU's setting, forced on this CPU: a real DeepSpeed engine) keeps bf16
    gradients that a multiplication would round: the start fails, naming the fields to change."""
    import trainer.engine as engine_module

    config = engine_module.deepspeed_config
    monkeypatch.setattr(engine_module, "deepspeed_config", lambda spec, world, bf16: config(spec, world, True))
    spec = tiny_spec(loss_aggregation="token-mean")
    spec.trainer.zero_stage = 0
    with pytest.raises(ValueError, match="trainer.zeroStage >= 1, or lossAggregation 'token' or 'sequence'"):
        engine_module.PolicyEngine(tiny_model_dir, spec)
