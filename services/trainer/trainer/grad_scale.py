"""Multiply a step's accumulated gradient by a factor known only at its optimizer step, before DeepSpeed clips it.

Why (algorithm.lossAggregation 'token-mean'): a step's micro-batches train as its trajectories stream in, so the
step's number of loss tokens T, the token mean's normaliser, is unknown when its first micro-batch backpropagates.
Each micro-batch backpropagates its token sum over a normaliser known up front (N0 = sequences x maxNewTokens, the
'token' share); gradients are linear in the loss, so the accumulated gradient is T / N0 times the gradient of
sum / T, and multiplying it by `factor` = N0 / T (trainer.grpo.token_mean_scale) at the boundary gives exactly the
token mean's gradient. It must happen before the gradient norm is taken (clipping, the reported norm)
and before Adam, which is not invariant to a scale that changes from step to step.

Where DeepSpeed keeps the accumulated gradient depends on its optimizer, so does the multiplication (`kind`):
- 'loss-scale', the ZeRO 1-3 optimizers (DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3; fp32 or bf16): a
  loss scale is exactly "the accumulated gradient is the true one times s", and their step() divides by it before
  the norm and the clip. The scale 1 / factor is set before the step and 1.0 after it (a loss times 1.0 is itself,
  so the next backward is unchanged).
- 'hp-buffers', BF16_Optimizer (ZeRO-1 with bf16 parameters and fp32 gradient accumulation): it ignores the loss
  scale; its fp32 accumulation buffers are multiplied in place (before step() reduces them over ranks: linear).
- 'grads', a plain torch optimizer (ZeRO-0 in fp32): the parameters' .grad, likewise.
Any other (ZeRO-0 with bf16 parameters: FP16_Optimizer, whose bf16 gradients a multiplication would round) is
refused when the engine starts (`check`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def kind(engine: Any) -> str | None:
    """How `engine`'s accumulated gradient is scaled; None: it cannot be, exactly."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    opt = engine.optimizer
    if isinstance(opt, DeepSpeedZeroOptimizer | DeepSpeedZeroOptimizer_Stage3):
        return "loss-scale"
    if isinstance(opt, BF16_Optimizer):
        return "hp-buffers"
    if isinstance(opt, torch.optim.Optimizer):  # DeepSpeed's own wrappers are not torch optimizers
        return "grads"
    return None


def check(engine: Any) -> None:
    """At start, with algorithm.lossAggregation 'token-mean': an optimizer whose gradient cannot be rescaled exactly
    fails the start, naming the fields."""
    if kind(engine) is None:
        raise ValueError(
            f"algorithm.lossAggregation 'token-mean' rescales each step's gradient in DeepSpeed's optimizer, which "
            f"{type(engine.optimizer).__name__} (trainer.zeroStage 0 with bf16) does not allow exactly: set "
            "trainer.zeroStage >= 1, or lossAggregation 'token' or 'sequence'"
        )


@contextmanager
def scaled_gradients(engine: Any, factor: float) -> Iterator[None]:
    """Within the block (the engine's step()), the accumulated gradient counts as `factor` times what it is."""
    if factor == 1.0:
        yield
        return
    how, opt = kind(engine), engine.optimizer
    if how == "loss-scale":
        _set_loss_scale(opt, 1.0 / factor)
        try:
            yield
        finally:
            _set_loss_scale(opt, 1.0)
        return
    if how == "hp-buffers":
        for flat in opt.fp32_groups_gradients_flat:
            flat.mul_(factor)
    elif how == "grads":
        for p in engine.module.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
    else:
        check(engine)
    yield


def _set_loss_scale(opt: Any, scale: float) -> None:
    """What the ZeRO optimizers' override_loss_scale(scale) sets, without its INFO log line at every change (two
    per step here)."""
    opt.custom_loss_scaler = True
    opt.external_loss_scale = scale
