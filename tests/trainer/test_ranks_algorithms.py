"""A step's gradient is the same on 2 ranks as on 1 with the options whose normalisers span the whole step:
'token-mean' (the step's tokens, summed over ranks at the optimizer step), advantageNormalization 'batch' (the
step's std), klInReward (a scoring round per rank before the step trains), updatesPerStep 2 (each rank replays its
own micro-batches), with the rollout correction and the dual clip on. Real `python -m trainer` rank processes (gloo,
ZeRO-2) against the stand-in rollout-manager, a real weight-server and NATS, as tests/trainer/test_ranks.py; one
sample of each step is dropped by the stand-in, so the baseline's exclusion is in the run too.
"""

from __future__ import annotations

import pytest
import torch

from tests.trainer.conftest import tiny_spec
from tests.trainer.test_ranks import _train

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


@pytest.mark.slow
async def test_whole_step_normalisers_train_on_two_ranks_as_on_one(tmp_path, tiny_model_dir, nats_server):
    spec = tiny_spec(
        prompts_per_step=4,
        micro_batch_size=2,
        learning_rate=2e-2,
        loss_aggregation="token-mean",
        advantage_normalization="batch",
        kl_coef=0.05,
        kl_in_reward=True,
        updates_per_step=2,
        rollout_correction={"mode": "tis", "level": "token", "cap": 2.0},
        dual_clip=3.0,
    )
    spec.trainer.zero_stage = 2
    one, one_states, stand_in = await _train(
        tmp_path, spec, tiny_model_dir, nats_server.url, "a1", world=1, steps=2, dropped={(1, 0)}
    )
    spec.trainer.ranks = 2
    two, two_states, _ = await _train(
        tmp_path, spec, tiny_model_dir, nats_server.url, "a2", world=2, steps=2, dropped={(1, 0)}
    )
    assert [s.ranks for s in two["steps"]] == [2, 2] and [s.ranks for s in one["steps"]] == [1, 1]
    for a, b in zip(one["steps"], two["steps"], strict=True):
        assert a.tokens == b.tokens and a.reward_mean == b.reward_mean and a.baseline_excluded == 1
        for field in ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "logprob_mismatch_mean"):
            assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-5), field
        assert b.logprob_mismatch_max == pytest.approx(a.logprob_mismatch_max, rel=1e-6)
        assert a.logprob_mismatch_mean > 0 and a.grad_norm > 0  # the stand-in's log-probs are -1.0: a gap
    assert one["steps"][1].kl > 0  # after the first step the policy has left its reference
    for name, want in one_states[2].items():
        torch.testing.assert_close(two_states[2][name].float(), want.float(), rtol=2**-7, atol=1e-6, msg=name)
