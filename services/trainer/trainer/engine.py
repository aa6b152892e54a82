"""The DeepSpeed policy engine: load the HF model (fp32 master weights), train micro-batches, export bf16.

One rank by default (single-process rendezvous env is filled in when absent); several ranks come from
the usual RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT env (torchrun or a StatefulSet). The optimizer is a
plain torch AdamW handed to DeepSpeed: an "optimizer" block in the DeepSpeed config would compile fused
Adam. Gradient accumulation is unmanaged (`managed_gradient_accumulation: false`): backward() may run any
number of times while a step's trajectories stream in, and step() is the boundary.

DeepSpeed and transformers are imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlboost.nats_server import free_port
from rlboost.spec import JobSpec
from trainer.grpo import LossStats, MicroBatch, behaviour_logprobs, clipped_policy_loss, token_logprobs

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so a run is reproducible given the same rollouts."""
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def ensure_dist_env() -> None:
    """Fill in a single-rank rendezvous when the launcher set none (a free port, so concurrent runs coexist)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def resolve_backend(backend: str) -> str:
    """'auto' -> nccl on GPU, gloo on CPU."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def deepspeed_config(spec: JobSpec, world_size: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config of a job (no "optimizer" block, see the module docstring)."""
    return {
        "train_micro_batch_size_per_gpu": spec.algorithm.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": spec.algorithm.micro_batch_size * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": spec.algorithm.grad_clip,
        "zero_optimization": {"stage": spec.trainer.zero_stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


@dataclass
class StepResult:
    grad_norm: float
    learning_rate: float


class PolicyEngine:
    """A causal LM wrapped by DeepSpeed, trained with the GRPO clipped loss."""

    def __init__(self, model_dir: str | Path, spec: JobSpec) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        ensure_dist_env()
        seed_everything(spec.algorithm.seed)
        self.spec = spec
        self.temperature = spec.algorithm.temperature
        self.clip_ratio = spec.algorithm.clip_ratio
        self.device_is_gpu = torch.cuda.is_available()
        backend = resolve_backend(spec.trainer.backend)
        deepspeed.init_distributed(dist_backend=backend)
        world = int(os.environ["WORLD_SIZE"])

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.config.use_cache = False
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.algorithm.learning_rate, weight_decay=0.0)
        config = deepspeed_config(spec, world, bf16=self.device_is_gpu)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.engine.train()
        log.info(
            "deepspeed ready", extra={"backend": backend, "world_size": world, "zero_stage": spec.trainer.zero_stage}
        )

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """[B, L-1] log-probs of the batch's targets under the current policy (batch already on device)."""
        out = self.engine(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        return token_logprobs(out.logits, batch.input_ids, self.temperature)

    def _loss(self, batch: MicroBatch, num_sequences: int) -> tuple[torch.Tensor, LossStats]:
        logp = self.logprobs(batch)
        old = behaviour_logprobs(batch, logp)
        return clipped_policy_loss(logp, old, batch.advantages, batch.response_mask, self.clip_ratio, num_sequences)

    def forward_backward(self, batch: MicroBatch, num_sequences: int) -> tuple[float, LossStats]:
        """Accumulate one micro-batch's gradient; returns its share of the step loss and diagnostics."""
        loss, stats = self._loss(batch.to(self.device), num_sequences)
        self.engine.backward(loss, scale_wrt_gas=False)
        return float(loss.detach().item()), stats

    @torch.no_grad()
    def evaluate_loss(self, batch: MicroBatch, num_sequences: int) -> float:
        """The loss of a batch without touching gradients (tests, diagnostics)."""
        loss, _ = self._loss(batch.to(self.device), num_sequences)
        return float(loss.item())

    def step(self) -> StepResult:
        """Apply the accumulated gradient (clipped): one optimizer step per RL step."""
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        lr = self.engine.get_lr()[0]
        return StepResult(grad_norm=float(norm) if norm is not None else float("nan"), learning_rate=float(lr))

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model state (HF names, CPU), gathered from ZeRO-3 partitions when needed."""
        module = self.engine.module
        if self.spec.trainer.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
