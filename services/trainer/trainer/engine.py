"""The DeepSpeed policy engine: load the HF model (fp32 master weights), train micro-batches, export bf16.

One rank by default (single-process rendezvous env is filled in when absent); several ranks come from
the usual RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT env (torchrun or a StatefulSet). The optimizer is a
plain torch AdamW handed to DeepSpeed: an "optimizer" block in the DeepSpeed config would compile fused
Adam. Gradient accumulation is unmanaged (`managed_gradient_accumulation: false`): backward() may run any
number of times while a step's trajectories stream in, and step() is the boundary.

Publication: `publish_state()` gives rank 0 the bf16 state the publisher uploads. Under ZeRO-3 each rank
extracts the bf16 delta of its own partition and only that moves to rank 0 (trainer.partition_delta);
stages 0-2, or a ZeRO-3 layout it cannot read (NVMe offload, subgroup partitioning), gather the full
parameters instead (`full_state()`). The choice is logged at start-up ("state_extraction") and each
extraction's bytes moved to rank 0 are logged and exported as metrics.

DeepSpeed and transformers are imported inside functions so that importing this module stays cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlboost.nats_server import free_port
from rlboost.spec import JobSpec, effective_micro_batch
from trainer import grad_scale, prompt_sharing
from trainer.grpo import LossStats, MicroBatch, token_logprobs, token_mean_scale
from trainer.objective import Objective

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


def skip_inference_allreduce_build() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce op at init_distributed.

    DeepSpeed's torch backend builds that C++ extension (deepspeed_shm_comm) on every CPU rank: about a minute
    of compiler on 2 cores in each new environment (every clean CI clone; and environments at other paths
    rebuild it in turn), 0.2 s to load once built. Only `inference_all_reduce` calls it; training never does,
    and without it a trainer image needs no compiler. DeepSpeed keeps the result of its op probe in
    `deepspeed.ops.__compatible_ops__`, a dict meant to be edited.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_config(spec: JobSpec, world_size: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config of a job (no "optimizer" block, see the module docstring)."""
    return {
        "train_micro_batch_size_per_gpu": effective_micro_batch(spec),
        "gradient_accumulation_steps": 1,
        "train_batch_size": effective_micro_batch(spec) * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": spec.algorithm.grad_clip,
        "zero_optimization": {"stage": spec.trainer.zero_stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def keep_clipped_norm(engine: Any) -> None:
    """ZeRO-0 in fp32: DeepSpeed clips the gradient with a plain torch optimizer but drops the norm it computed, so
    `get_global_grad_norm()` reads None (a NaN grad_norm in every step report). Its clipping method is replaced on
    this engine by the same call that keeps the norm. The ZeRO optimizers (and bf16's) keep it themselves."""
    from deepspeed.runtime.utils import clip_grad_norm_

    def clip_keeping_norm() -> None:
        params, clip = engine.module.parameters(), engine.gradient_clipping()
        engine._global_grad_norm = clip_grad_norm_(parameters=params, max_norm=clip, mpu=engine.mpu)

    engine.clip_fp32_gradients = clip_keeping_norm


def _frozen_copy(model_dir: str | Path) -> Any:
    """The model at `model_dir` in fp32, for scoring only (no cache, no gradients): the KL reference, the kept
    behaviour policy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    return model.eval().requires_grad_(False)


@dataclass
class StepResult:
    grad_norm: float
    learning_rate: float
    loss_scale: float = (
        1.0  # 'token-mean': what the step's micro-batch losses are multiplied by (grpo.token_mean_scale)
    )


@dataclass
class StepPasses:
    """One rank's record of the step so far: its loss tokens (the 'token-mean' normaliser, summed over ranks at the
    optimizer step) and, with algorithm.updatesPerStep > 1, each micro-batch it trained with the old log-probs of its
    first pass, for the further updates."""

    num_sequences: int = 0
    tokens: int = 0
    replay: list[tuple[MicroBatch, torch.Tensor]] = dataclasses.field(default_factory=list)


class PolicyEngine:
    """A causal LM wrapped by DeepSpeed, trained with the GRPO clipped loss (+ optional KL and entropy terms).

    With `algorithm.klCoef > 0` a frozen fp32 copy of the initial model is kept on every rank as the KL
    reference (not partitioned: fine for the models this runs on CPU; on GPUs a ZeRO-3 reference would be
    the next step). The loss itself: trainer.objective; a step's further updates (algorithm.updatesPerStep) replay
    its micro-batches against their first pass's old log-probs (`replay`).
    """

    def __init__(self, model_dir: str | Path, spec: JobSpec) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        ensure_dist_env()
        seed_everything(spec.algorithm.seed)
        self.spec = spec
        alg = spec.algorithm
        self.temperature = alg.temperature
        self.objective = Objective(alg, spec.max_trained_tokens())
        self.passes = StepPasses()
        self.device_is_gpu = torch.cuda.is_available()
        backend = resolve_backend(spec.trainer.backend)
        skip_inference_allreduce_build()
        deepspeed.init_distributed(dist_backend=backend)
        self.world = int(os.environ["WORLD_SIZE"])
        self.rank = int(os.environ["RANK"])

        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.config.use_cache = False
        self.reference = _frozen_copy(model_dir) if alg.kl_coef > 0 else None
        # rolloutCorrection.oldLogprobs 'trainer': the weights one version before, as published (keep_behaviour)
        self.behaviour = _frozen_copy(model_dir) if alg.rollout_correction.old_logprobs == "trainer" else None
        self.behaviour_kept = False  # keep_behaviour ran: the copy holds a version this trainer published
        optimizer = torch.optim.AdamW(model.parameters(), lr=alg.learning_rate, weight_decay=0.0)
        config = deepspeed_config(spec, self.world, bf16=self.device_is_gpu)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.engine.train()
        if spec.trainer.zero_stage == 0 and not self.device_is_gpu:
            keep_clipped_norm(self.engine)
        if alg.loss_aggregation == "token-mean":
            grad_scale.check(self.engine)  # an optimizer whose gradient cannot be rescaled fails the start
        for frozen in (self.reference, self.behaviour):
            if frozen is not None:
                frozen.to(self.engine.device)
        self.extraction, why = self._choose_extraction()
        log.info(
            "deepspeed ready",
            extra={
                "backend": backend,
                "world_size": self.world,
                "rank": self.rank,
                "zero_stage": spec.trainer.zero_stage,
                "state_extraction": self.extraction,
                "state_extraction_why": why,
            },
        )

    def _choose_extraction(self) -> tuple[str, str]:
        """'partitioned' (ZeRO-3: per-rank deltas, see trainer.partition_delta) or 'gathered', and why."""
        from trainer.partition_delta import PartitionDeltaExtractor, unsupported_reason

        self._extractor: PartitionDeltaExtractor | None = None
        self.last_extraction: dict[str, Any] = {}  # the last publish_state()'s path and traffic
        if self.spec.trainer.zero_stage != 3:
            return "gathered", f"ZeRO stage {self.spec.trainer.zero_stage}: rank 0 holds every parameter"
        reason = unsupported_reason(self.engine.module, self.world)
        if reason is not None:
            return "gathered", f"ZeRO-3 fallback: {reason}"
        self._extractor = PartitionDeltaExtractor(self.engine.module, self.rank, self.world)
        return "partitioned", "ZeRO-3: each rank extracts the delta of its own partition"

    @property
    def device(self) -> torch.device:
        return self.engine.device

    def logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """[B, L-1] log-probs of the batch's targets under the current policy (batch already on device); only the
        responses' are computed when prompts are shared (trainer.prompt_sharing), the prompt's then read 0."""
        return self._target_logprobs(self.engine, batch)

    def reference_logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """[B, L-1] log-probs of the batch's response targets under the frozen reference (batch already on device)."""
        with torch.no_grad():
            return self._target_logprobs(self.reference, batch)

    def _target_logprobs(self, model: Any, batch: MicroBatch) -> torch.Tensor:
        shared, view = self._coordinates(batch)
        logp = token_logprobs(self._logits(model, batch, shared), view.input_ids, self.temperature)
        if shared is None:
            return logp
        return prompt_sharing.to_targets(logp, shared, batch.response_mask.shape[1])

    def _coordinates(self, batch: MicroBatch) -> tuple[prompt_sharing.SharedPrompts | None, MicroBatch]:
        """The batch's prompt sharing (None: a plain forward; trainer.sharePrompts) and the batch in the
        coordinates of its logits (trainer.prompt_sharing.view)."""
        shared = prompt_sharing.plan(batch) if self.spec.trainer.share_prompts else None
        return shared, batch if shared is None else prompt_sharing.view(batch, shared)

    def _logits(self, model: Any, batch: MicroBatch, shared: prompt_sharing.SharedPrompts | None) -> torch.Tensor:
        if shared is None:
            return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return prompt_sharing.forward(model, shared)

    def _loss(
        self, batch: MicroBatch, num_sequences: int, old: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, LossStats, torch.Tensor]:
        """(loss share, statistics, old log-probs), the old log-probs in the coordinates of the batch's logits (the
        same on a replay: `_coordinates` is a function of the batch)."""
        shared, view = self._coordinates(batch)
        logits = self._logits(self.engine, batch, shared)
        where = view.loss_mask() > 0
        logp = token_logprobs(logits, view.input_ids, self.temperature, where=where)
        ref_logp = behaviour = None
        with torch.no_grad():
            if self.objective.kl_in_loss:
                ref_logp = token_logprobs(self._logits(self.reference, batch, shared), view.input_ids, self.temperature)
            if old is None and self.behaviour is not None and view.stale is not None and bool(view.stale.any()):
                behaviour = self._behaviour_logprobs(batch, shared, view, where)
        return self.objective.loss(logits, logp, view, num_sequences, old=old, ref_logp=ref_logp, behaviour=behaviour)

    def _behaviour_logprobs(
        self, batch: MicroBatch, shared: prompt_sharing.SharedPrompts | None, view: MicroBatch, where: torch.Tensor
    ) -> torch.Tensor | None:
        """The stale rows' old log-probs under the kept weights; None (the workers' then) before any were kept: a
        stale row in the first step after the trainer started, which rolloutAhead never makes (that step is
        on-policy) and the spec's checks leave no other way to."""
        if not self.behaviour_kept:
            log.warning("stale rows before any weights were kept: their old log-probs are the workers'")
            return None
        return token_logprobs(self._logits(self.behaviour, batch, shared), view.input_ids, self.temperature, where)

    @torch.no_grad()
    def keep_behaviour(self) -> None:
        """rolloutCorrection.oldLogprobs 'trainer', before the step's first update: the frozen copy takes the weights
        as the workers get them (the publisher's bf16 rounding: rlboost.weights.safetensors_io.to_publish_dtype), the
        policy the next step's stale rows are sampled from. Every rank; ZeRO 0-2 (each holds every parameter)."""
        if self.behaviour is None:
            return
        mine = dict(self.engine.module.named_parameters())
        for name, frozen in self.behaviour.named_parameters():
            frozen.copy_(mine[name].detach().to(torch.bfloat16))
        self.behaviour_kept = True

    def forward_backward(self, batch: MicroBatch, num_sequences: int) -> tuple[float, LossStats]:
        """Accumulate one micro-batch's gradient; returns its share of the step loss and diagnostics."""
        batch = batch.to(self.device)
        loss, stats, old = self._loss(batch, num_sequences)
        self._backward(loss)
        self.passes.num_sequences, self.passes.tokens = num_sequences, self.passes.tokens + stats.tokens
        if self.spec.algorithm.updates_per_step > 1:
            self.passes.replay.append((batch, old.detach()))
        return float(loss.detach().item()), stats

    def _backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; x world makes the step's gradient the sum over its micro-batches
        # (num_sequences normalises it), as with one rank. Exact for a power-of-two world.
        self.engine.backward(loss * self.world if self.world > 1 else loss, scale_wrt_gas=False)

    def replay(self) -> tuple[float, LossStats]:
        """A further update's passes (algorithm.updatesPerStep): every micro-batch this rank trained in the step,
        in order, against its first pass's old log-probs; the summed loss shares and statistics."""
        total, stats = 0.0, LossStats(0, 0, 0.0, 0.0)
        for batch, old in self.passes.replay:
            loss, more, _ = self._loss(batch, self.passes.num_sequences, old=old)
            self._backward(loss)
            total, stats = total + float(loss.detach().item()), stats + more
        return total, stats

    @torch.no_grad()
    def sequence_kl(self, batch: MicroBatch) -> list[float]:
        """algorithm.klInReward: each row's KL to the reference summed over its loss tokens, at the current weights."""
        batch = batch.to(self.device)
        logp = self.logprobs(batch)
        return self.objective.sequence_kl(logp, self.reference_logprobs(batch), batch.loss_mask())

    @torch.no_grad()
    def evaluate_loss(self, batch: MicroBatch, num_sequences: int) -> float:
        """The loss of a batch without touching gradients (tests, diagnostics); 'token-mean': the provisional
        share (grpo.token_mean_scale)."""
        loss, _, _ = self._loss(batch.to(self.device), num_sequences)
        return float(loss.item())

    def step(self) -> StepResult:
        """Apply the accumulated gradient (clipped): one optimizer update. 'token-mean' first rescales it to the
        step's token mean (trainer.grad_scale)."""
        scale = self._token_mean_scale()
        with grad_scale.scaled_gradients(self.engine, scale):
            self.engine.step()
        norm = self.engine.get_global_grad_norm()
        lr = self.engine.get_lr()[0]
        grad_norm = float(norm) if norm is not None else float("nan")
        return StepResult(grad_norm=grad_norm, learning_rate=float(lr), loss_scale=scale)

    def end_step(self) -> None:
        """The step's updates are done: forget its record (every rank, after its last `step`)."""
        self.passes = StepPasses()

    def _token_mean_scale(self) -> float:
        """'token-mean': N0 / T, T the step's loss tokens summed over ranks (grpo.token_mean_scale); else 1."""
        alg = self.spec.algorithm
        if alg.loss_aggregation != "token-mean":
            return 1.0
        tokens = self.passes.tokens
        if self.world > 1:
            import torch.distributed as dist

            count = torch.tensor([tokens], dtype=torch.float64)
            dist.all_reduce(count)
            tokens = int(count.item())
        return token_mean_scale(self.passes.num_sequences, self.objective.max_tokens, tokens)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model state (HF names, CPU) on rank 0; other ranks return {} (they only take part).

        Under ZeRO-3 parameters are gathered one at a time (GatheredParameters per tensor), so no rank ever
        holds more than the largest parameter beyond its own partition; every rank must call this.
        """
        module = self.engine.module
        if self.spec.trainer.zero_stage != 3:
            if self.rank != 0:
                return {}
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
        import deepspeed

        out: dict[str, torch.Tensor] = {}
        first_name: dict[int, str] = {}  # tied weights: gathered once (the same on every rank: collectives)
        for name, t in module.state_dict(keep_vars=True).items():
            if id(t) in first_name:
                if self.rank == 0:
                    out[name] = out[first_name[id(t)]].clone()  # separate storage, as safetensors wants
                continue
            first_name[id(t)] = name
            if hasattr(t, "ds_id"):
                with deepspeed.zero.GatheredParameters([t], modifier_rank=None):
                    if self.rank == 0:
                        out[name] = t.detach().cpu().clone()
            elif self.rank == 0:
                out[name] = t.detach().cpu().clone()
        return out

    def publish_state(self, path: str | None = None) -> dict[str, torch.Tensor]:
        """The bf16 state to publish (HF names, CPU) on rank 0; other ranks return {}. Every rank must call it.

        `path` (default: the engine's choice, `self.extraction`) is 'partitioned' (ZeRO-3 only: per-rank
        partition deltas, trainer.partition_delta) or 'gathered' (full_state() cast to bf16); both give the
        same bits. The bytes moved to rank 0 go to the log and the metrics rlboost_trainer_extraction_last_bytes
        and rlboost_trainer_extraction_bytes_total (label `path`).
        """
        from rlboost.weights.safetensors_io import to_publish_dtype
        from trainer.partition_delta import EXTRACTION_BYTES, EXTRACTION_BYTES_TOTAL

        path = path or self.extraction
        if path == "partitioned":
            if self._extractor is None:
                raise ValueError(f"partitioned state extraction needs ZeRO-3 partitions ({self.extraction} in use)")
            state, stats = self._extractor.extract()
            detail = dataclasses.asdict(stats)
            moved = detail.pop("bytes_to_rank0")
        elif path == "gathered":
            full = self.full_state()
            state = {k: v.contiguous() for k, v in to_publish_dtype(full).items()}
            moved, detail = self._gathered_bytes(), {}
        else:
            raise ValueError(f"state extraction path must be 'partitioned' or 'gathered', got {path!r}")
        self.last_extraction = {"path": path, "bytes_to_rank0": moved, **detail}
        if self.rank == 0:
            EXTRACTION_BYTES.labels(path).set(moved)
            EXTRACTION_BYTES_TOTAL.labels(path).inc(moved)
            log.info("state extracted", extra={"state_extraction": path, "extraction_bytes": moved, **detail})
        return state

    def _gathered_bytes(self) -> int:
        """Bytes rank 0 receives gathering the ZeRO-3 parameters (the other ranks' shares); 0 below stage 3."""
        if self.spec.trainer.zero_stage != 3 or self.world == 1:
            return 0
        seen: set[int] = set()
        total = 0
        for t in self.engine.module.state_dict(keep_vars=True).values():
            if hasattr(t, "ds_id") and id(t) not in seen:
                seen.add(id(t))
                total += t.ds_numel * t.element_size() * (self.world - 1) // self.world
        return total
