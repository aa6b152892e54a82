"""Multiply a step's accumulated gradient by a factor known only at its optimizer step, before DeepSpeed clips it.

Why (algorithm.lossAggregation 'token-mean'): a step's micro-batches train as its trajectories stream in, so the
step's number of loss tokens T, the token mean's normaliser, is unknown when its first micro-batch backpropagates.
Each micro-batch backpropagates its token sum over a normaliser known up front (N0 = sequences x maxNewTokens, the
'token' share); gradients are linear in the loss, so the accumulated gradient is T / N0 times the gradient of
sum / T, and multiplying it by `factor` = N0 / T (trainer.grpo.token_mean_scale) at the boundary gives exactly the
token mean's gradient. It must happen before the gradient norm is taken (clipping, the reported norm)
and before Adam, which is not invariant to a scale that changes from step to step.

Where DeepSpeed keeps the accumulated gradient depends on its optimizer, so does the multiplication:
- ZeRO 1-3 optimizers (DeepSpeedZeroOptimizer, ..._Stage3): a loss scale is exactly "the accumulated gradient is
  the true one times s"; their step() divides by it before the norm and the clip. `override_loss_scale(1 / factor)`
  before the step, 1.0 after it (a loss multiplied by 1.0 is itself: the next backward is unchanged).
- BF16_Optimizer (ZeRO-1 with bf16 parameters, GPUs): it ignores the loss scale; its fp32 accumulation buffers are
  multiplied in place (before step() reduces them over ranks: the reduction is linear).
- a plain torch optimizer (ZeRO-0 in fp32): the parameters' .grad, likewise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def scaled_gradients(engine: Any, factor: float) -> Iterator[None]:
    """Within the block (the engine's step()), the accumulated gradient counts as `factor` times what it is."""
    if factor == 1.0:
        yield
        return
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    opt = engine.optimizer
    if isinstance(opt, BF16_Optimizer):
        for flat in opt.fp32_groups_gradients_flat:
            flat.mul_(factor)
        yield
    elif hasattr(opt, "override_loss_scale"):
        _set_loss_scale(opt, 1.0 / factor)
        try:
            yield
        finally:
            _set_loss_scale(opt, 1.0)
    else:
        for p in engine.module.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)
        yield


def _set_loss_scale(opt: Any, scale: float) -> None:
    """What the ZeRO optimizers' override_loss_scale(scale) sets, without its INFO log line at every change (two
    per step here)."""
    opt.custom_loss_scaler = True
    opt.external_loss_scale = scale
