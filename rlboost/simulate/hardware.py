"""Roofline models of LLM decode, prefill and training on one accelerator kind.

Decode is memory-bound at small batch (weights + KV cache read per step) and compute-bound at
large batch; achieved fractions of peak (`bw_efficiency`, `mfu_*`) are the calibration knobs
(docs/simulation.md cites the public figures they were set against).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str
    hbm_bytes: float  # device memory
    hbm_bw: float  # bytes/s, peak
    bf16_flops: float  # dense, peak
    bw_efficiency: float = 0.7  # achieved fraction of hbm_bw in decode
    mfu_decode: float = 0.5  # achieved fraction of bf16_flops when decode is compute-bound
    mfu_train: float = 0.4  # model FLOPs utilisation of training
    step_overhead_s: float = 0.004  # scheduler + launch per decode step


H100 = Accelerator("h100", hbm_bytes=80e9, hbm_bw=3.35e12, bf16_flops=989e12)


@dataclass(frozen=True)
class LlmShape:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    tp: int  # GPUs per rollout instance

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0  # K and V, bf16


MODELS = {
    "qwen3-1.7b": LlmShape("qwen3-1.7b", 2.03e9, 28, 8, 128, tp=1),
    "qwen3-8b": LlmShape("qwen3-8b", 8.19e9, 36, 8, 128, tp=1),
    "qwen3-14b": LlmShape("qwen3-14b", 14.8e9, 40, 8, 128, tp=2),
}


def kv_capacity_tokens(model: LlmShape, acc: Accelerator, mem_fraction: float = 0.85) -> float:
    """Tokens of KV cache one instance (tp GPUs) holds beside its weights."""
    free = acc.hbm_bytes * model.tp * mem_fraction - model.weight_bytes
    return max(free, 0.0) / model.kv_bytes_per_token


def decode_step_seconds(model: LlmShape, acc: Accelerator, batch: float, kv_tokens: float) -> float:
    """One decode step of `batch` sequences holding `kv_tokens` of context in total."""
    if batch <= 0:
        return acc.step_overhead_s
    memory = (model.weight_bytes + kv_tokens * model.kv_bytes_per_token) / (acc.hbm_bw * acc.bw_efficiency * model.tp)
    compute = 2.0 * model.params * batch / (acc.bf16_flops * acc.mfu_decode * model.tp)
    return max(memory, compute) + acc.step_overhead_s


def prefill_seconds(model: LlmShape, acc: Accelerator, tokens: float) -> float:
    """Prefill (or re-prefill after a migration) of `tokens` context tokens."""
    return 2.0 * model.params * tokens / (acc.bf16_flops * acc.mfu_train * model.tp)


def train_seconds(model: LlmShape, acc: Accelerator, tokens: float, gpus: int) -> float:
    """A GRPO step over `tokens` (forward+backward, plus the old-policy log-prob forward)."""
    if gpus <= 0:
        return float("inf")
    return 8.0 * model.params * tokens / (acc.bf16_flops * acc.mfu_train * gpus)


def sync_seconds(payload_bytes: float, link_bytes_per_s: float, latency_s: float = 0.05) -> float:
    return latency_s + payload_bytes / link_bytes_per_s
