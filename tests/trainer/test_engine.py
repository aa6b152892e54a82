"""The DeepSpeed engine on CPU (gloo, ZeRO-1, one rank): a real optimizer step on a tiny Qwen3 model.

DeepSpeed would JIT-compile its shm all-reduce op at init_distributed (60-90 s in a new environment); the
engine turns that inference-only op off, and the first test checks it stayed unbuilt.
"""

from __future__ import annotations

import pytest
import torch

from rlboost.wire.rollout_io import Trajectory
from tests.trainer.conftest import tiny_spec
from trainer.engine import PolicyEngine, deepspeed_config
from trainer.grpo import Sample, collate

# DeepSpeed's ZeRO optimizer check imports its Muon module, which torch.compile()s at import and so
# imports torch.utils.mkldnn, which warns about torch.jit.script_method: third-party noise.
# ZeRO-3 on gloo calls torch.distributed collectives that torch deprecates (FutureWarning). Both third-party.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.distributed.:FutureWarning"),
]


def _batch(engine: PolicyEngine) -> tuple:
    """A fixed batch: two prompts x two samples, behaviour log-probs from the initial policy."""
    g = torch.Generator().manual_seed(3)
    samples = []
    for p in range(2):
        prompt = torch.randint(5, 60, (4 + p,), generator=g).tolist()
        for s in range(2):
            resp = torch.randint(5, 60, (3,), generator=g).tolist()
            t = Trajectory(f"s0-p{p}-g{s}", 0, p, s, prompt, resp, [], "length", 0)
            samples.append(Sample(t, reward=float(s), advantage=1.0 if s else -1.0))
    mb = collate(samples, pad_id=0)
    with torch.no_grad():
        logp = engine.logprobs(mb.to(engine.device))
    for i, smp in enumerate(samples):
        p_len, n = len(smp.trajectory.prompt_ids), len(smp.trajectory.response_ids)
        smp.trajectory.logprobs = logp[i, p_len - 1 : p_len - 1 + n].tolist()
    return collate(samples, pad_id=0), len(samples)


@pytest.mark.parametrize("zero_stage", [0, 1, 3])
def test_one_step_changes_weights_and_lowers_the_loss(tiny_model_dir, zero_stage):
    """ZeRO-3 also exercises gathering the partitioned parameters for publication; ZeRO-0, a plain torch optimizer,
    the gradient norm that DeepSpeed computes there but does not keep (trainer.engine.keep_clipped_norm)."""
    spec = tiny_spec(learning_rate=5e-3, micro_batch_size=2)
    spec.trainer.zero_stage = zero_stage
    engine = PolicyEngine(tiny_model_dir, spec)
    from deepspeed.comm import comm

    assert comm.cdb.shm_comm_op is None, "DeepSpeed's inference-only shm all-reduce must not be compiled"
    before = engine.full_state()
    batch, n = _batch(engine)
    loss0 = engine.evaluate_loss(batch, n)
    obj0 = _objective(engine, batch)
    # Two micro-batches accumulated, then one optimizer step (unmanaged accumulation).
    half = [collate_rows(batch, slice(0, 2)), collate_rows(batch, slice(2, 4))]
    parts = [engine.forward_backward(mb, n)[0] for mb in half]
    assert abs(sum(parts) - loss0) < 1e-5  # micro-batch losses add up to the step's loss
    result = engine.step()
    after = engine.full_state()
    assert set(after) == set(before) and all(after[k].shape == before[k].shape for k in before)
    assert result.grad_norm > 0 and result.learning_rate == 5e-3
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) >= len(before) // 2, f"only {changed} changed"
    # On-policy ratios are exactly 1 (see trainer.grpo), so the loss value does not move; what must move is
    # the advantage-weighted log-likelihood of the batch: up for A > 0, down for A < 0.
    assert _objective(engine, batch) > obj0 + 1e-4


def _objective(engine: PolicyEngine, batch) -> float:
    """sum over rows of A x mean response log-prob: what one GRPO step on this batch must increase."""
    with torch.no_grad():
        logp = engine.logprobs(batch.to(engine.device))
    mask = batch.response_mask
    per_row = (logp * mask).sum(1) / mask.sum(1)
    return float((batch.advantages * per_row).sum())


def collate_rows(batch, rows: slice):
    from trainer.grpo import MicroBatch

    return MicroBatch(*(getattr(batch, f)[rows] for f in batch.__dataclass_fields__))


def test_deepspeed_config_has_no_optimizer_block_and_unmanaged_accumulation():
    cfg = deepspeed_config(tiny_spec(micro_batch_size=2), world_size=2, bf16=False)
    assert "optimizer" not in cfg
    assert cfg["managed_gradient_accumulation"] is False
    assert cfg["train_batch_size"] == 4 and cfg["zero_optimization"] == {"stage": 1}
    assert cfg["gradient_clipping"] == 1.0


def test_kl_and_entropy_terms_train_with_a_frozen_reference(tiny_model_dir):
    """klCoef > 0 keeps a frozen reference: KL is 0 before the first step and > 0 after it."""
    spec = tiny_spec(learning_rate=5e-2, micro_batch_size=4, kl_coef=0.1, entropy_coef=0.01, loss_aggregation="token")
    engine = PolicyEngine(tiny_model_dir, spec)
    batch, n = _batch(engine)
    _, before = engine.forward_backward(batch, n)
    engine.step()
    _, after = engine.forward_backward(batch, n)
    assert before.kl_sum == pytest.approx(0.0, abs=1e-6) and after.kl_sum > 1e-6
    assert before.entropy_sum > 0 and after.entropy_sum > 0


@pytest.mark.parametrize("zero_stage", [1, 3])
def test_publish_state_is_the_bf16_cast_of_the_full_state(tiny_model_dir, zero_stage):
    """ZeRO-3 (one rank, in process) takes the partitioned path; stage 1 the gathered one. Same bits either way,
    and a state once returned never changes under later extractions (the publisher keeps it as a delta base)."""
    from rlboost.weights.checksum import state_checksum
    from rlboost.weights.safetensors_io import to_publish_dtype

    spec = tiny_spec(learning_rate=1e-4, micro_batch_size=4)
    spec.trainer.zero_stage = zero_stage
    engine = PolicyEngine(tiny_model_dir, spec)
    assert engine.extraction == ("partitioned" if zero_stage == 3 else "gathered")
    batch, n = _batch(engine)
    earlier: list[tuple[dict, str]] = []
    for step in range(3):
        if step:
            engine.forward_backward(batch, n)
            engine.step()
        got = engine.publish_state()
        assert {t.dtype for t in got.values()} == {torch.bfloat16}
        assert state_checksum(got) == state_checksum(to_publish_dtype(engine.full_state()))
        assert len({t.data_ptr() for t in got.values()}) == len(got)  # tied names: separate storage
        earlier.append((got, state_checksum(got)))
    assert all(state_checksum(s) == c for s, c in earlier)
    assert len({c for _, c in earlier}) == 3
    assert engine.last_extraction["path"] == engine.extraction and engine.last_extraction["bytes_to_rank0"] == 0
    with pytest.raises(ValueError, match="'partitioned' or 'gathered'"):
        engine.publish_state("scattered")
