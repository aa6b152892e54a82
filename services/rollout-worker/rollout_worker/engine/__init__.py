"""Generation engines behind one interface (base.Engine): `torch` (CPU, tests) and `sglang` (GPU; CPU via
scripts/setup_sglang_env.sh). `make_engine(name, ...)` builds one by name, importing only that backend."""

from __future__ import annotations

ENGINES = ("torch", "sglang")


def make_engine(name: str, capacity: int, dtype: str = "float32", device: str = "cpu", tensor_parallel: int = 1):
    """The engine called `name` (lazily imported: torch and sglang stay off the path until chosen);
    `tensor_parallel`: accelerators one engine shards the model over (SGLang only)."""
    if name == "torch":
        if tensor_parallel != 1:
            raise ValueError(f"engine torch requires tensorParallel 1, got {tensor_parallel}; use engine sglang")
        from rollout_worker.engine.torch_engine import TorchEngine

        return TorchEngine(capacity=capacity, dtype=dtype, device=device)
    if name == "sglang":
        from rollout_worker.engine.sglang_engine import SglangEngine

        return SglangEngine(capacity=capacity, dtype=dtype, device=device, tensor_parallel=tensor_parallel)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINES)}")
