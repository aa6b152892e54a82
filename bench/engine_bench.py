"""Rollout-engine figures: start-up time, decode tokens/s and weight-update time (full vs sparse delta).

    .venv/bin/python bench/engine_bench.py --engine torch
    .venv-sglang/bin/python bench/engine_bench.py --engine sglang
    .venv-sglang/bin/python bench/engine_bench.py --engine sglang --model-dir run/model --requests 32
    python bench/engine_bench.py --device cuda --dtype bfloat16 --requests 8 --tokens 160 --breakdown  # on a GPU

Without --model-dir it builds the tiny Qwen3 of the worker tests. Prints one JSON line of figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "services" / "rollout-worker")]


def _tiny_model(path: Path) -> Path:
    from tests.rollout_worker.conftest import make_tiny_model

    return make_tiny_model(path)


async def _run(args: argparse.Namespace) -> dict:
    import torch

    from rlboost.wire.rollout_io import Assignment, SamplingParams
    from rollout_worker.engine import make_engine
    from rollout_worker.engine.base import read_model_state

    model_dir = args.model_dir or str(_tiny_model(Path(tempfile.mkdtemp(prefix="engine-bench-"))))
    eng = make_engine(args.engine, capacity=args.requests, dtype=args.dtype, device=args.device)
    if args.engine == "sglang":
        eng.extra_args.update({"max_total_tokens": 32768, "context_length": 2048})
    t0 = time.perf_counter()
    await eng.start(model_dir)
    startup = time.perf_counter() - t0

    async def one(i: int) -> int:
        s = SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=i)
        n = 0
        async for step in eng.generate(Assignment(f"b{i}", 1, [5 + i % 50, 9, 3], 3, s, 0)):
            n += len(step.token_ids)
        return n

    await asyncio.gather(*(one(i) for i in range(2)))  # warm-up
    t0 = time.perf_counter()
    total = sum(await asyncio.gather(*(one(i) for i in range(args.requests))))
    decode_s = time.perf_counter() - t0
    breakdown = await _breakdown(eng, one, args) if args.breakdown else None

    old = read_model_state(model_dir)
    gen = torch.Generator().manual_seed(0)
    full = {k: (v.float() + 0.01 * torch.randn(v.shape, generator=gen)).to(v.dtype) for k, v in old.items()}
    t0 = time.perf_counter()
    await eng.update_weights(full, 1)
    full_s = time.perf_counter() - t0
    delta = dict(full)
    name = sorted(k for k in full if k.endswith("down_proj.weight"))[0]
    delta[name] = (full[name].float() * 1.01).to(full[name].dtype)
    t0 = time.perf_counter()
    await eng.update_weights(delta, 2)
    delta_s = time.perf_counter() - t0
    await eng.close()
    return {
        "engine": args.engine,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "startup_s": round(startup, 2),
        "requests": args.requests,
        "tokens": total,
        "tokens_per_s": round(total / decode_s, 1),
        "update_full_s": round(full_s, 4),
        "update_delta_1_tensor_s": round(delta_s, 4),
        "tensors": len(full),
        "breakdown": breakdown,
    }


def _timed(obj, name: str, totals: dict[str, list[float]], sync) -> None:
    """Wrap obj.name so each call's wall time (after a device sync) is added to totals[name]."""
    inner = getattr(obj, name)

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = inner(*a, **kw)
        sync()
        totals.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    setattr(obj, name, wrapper)


async def _breakdown(eng, one, args: argparse.Namespace) -> dict:
    """One more batch, each scheduler iteration timed and split into the model's forward and the sampler (the
    device synchronised after each, so the split is honest; the total is then a little slower than unmeasured)."""
    import torch

    from rollout_worker.engine import torch_engine

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    totals: dict[str, list[float]] = {}
    _timed(eng, "_iterate", totals, sync)
    _timed(eng.model, "forward", totals, sync)
    _timed(torch_engine, "sample_next", totals, sync)
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - t0
    n = len(totals.get("_iterate", [])) or 1
    per = {k: round(1000 * sum(v) / n, 3) for k, v in totals.items()}
    tokens_per_s = round(args.requests * args.tokens / wall, 1)  # the shapes of the timed batch, seen again
    return {
        "tokens_per_s": tokens_per_s,
        "iterations": n,
        "wall_ms_per_iteration": round(1000 * wall / n, 3),
        "ms_per_iteration": per,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["torch", "sglang"], default="torch")
    p.add_argument("--model-dir", default="", help="HF model directory (default: the tiny test model)")
    p.add_argument("--requests", type=int, default=16, help="concurrent requests")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the engine runs (torch engine)")
    p.add_argument("--dtype", default="float32", help="the engine's dtype (bfloat16 on a GPU)")
    p.add_argument("--breakdown", action="store_true", help="then time one more batch per iteration: forward, sampler")
    args = p.parse_args()
    if args.engine == "sglang":
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    print(json.dumps(asyncio.run(_run(args))))


if __name__ == "__main__":
    main()
