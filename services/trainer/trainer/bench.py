"""Step-time benchmark of the trainer's compute on the default example's batch shape (no network peers).

    python -m trainer.bench --ranks 2 --zero-stage 2 [--steps 3] [--model-dir DIR]

Spawns one process per rank (gloo rendezvous on loopback); each trains its share of a synthetic step
(promptsPerStep x groupSize samples of the default job spec, prompt 24 + response maxNewTokens tokens) in
micro-batches, then the optimizer step and the extraction of the bf16 state to publish. Rank 0 prints one JSON line:
the median seconds per step of forward/backward, optimizer step, state extraction, and the total.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _rank_main(model_dir: str, zero: int, steps: int) -> None:
    import torch

    from rlboost.spec import JobSpec, effective_micro_batch
    from rlboost.wire.rollout_io import Trajectory
    from trainer.engine import PolicyEngine
    from trainer.grpo import Sample, collate

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    spec = JobSpec()
    spec.trainer.ranks, spec.trainer.zero_stage = world, zero
    engine = PolicyEngine(model_dir, spec)
    alg = spec.algorithm
    batch = alg.prompts_per_step * alg.group_size
    micro = effective_micro_batch(spec)
    g = torch.Generator().manual_seed(rank)
    samples = [
        Sample(
            Trajectory(
                f"r{i}",
                0,
                0,
                0,
                torch.randint(5, 60, (24,), generator=g).tolist(),
                torch.randint(5, 60, (alg.max_new_tokens,), generator=g).tolist(),
                [],
                "length",
                0,
            ),
            reward=0.0,
            advantage=float(i % 2) - 0.5,
        )
        for i in range(batch // world)
    ]
    mbs = [collate(samples[i : i + micro], 0) for i in range(0, len(samples), micro)]
    rows = []
    for _ in range(steps):
        t0 = time.perf_counter()
        for mb in mbs:
            engine.forward_backward(mb, batch)
        t1 = time.perf_counter()
        engine.step()
        t2 = time.perf_counter()
        engine.publish_state()  # the bf16 state to publish (per-partition extraction under ZeRO-3)
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    if rank == 0:
        keep = rows[1:] or rows  # the first step includes warm-up
        med = [statistics.median(r[i] for r in keep) for i in range(4)]
        print(
            json.dumps(
                {
                    "ranks": world,
                    "zero_stage": zero,
                    "fwd_bwd_s": round(med[0], 3),
                    "optimizer_s": round(med[1], 3),
                    "extract_s": round(med[2], 3),
                    "step_s": round(med[3], 3),
                }
            )
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--model-dir", default="", help="default: the default example's tiny model, created once")
    p.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._rank:
        _rank_main(args.model_dir, args.zero_stage, args.steps)
        return 0
    from rlboost.nats_server import free_port

    model_dir = args.model_dir or str(Path("runs/bench-model").resolve())
    if not (Path(model_dir) / "config.json").exists():
        from rlboost.models import ensure_model
        from rlboost.spec import JobSpec

        spec = JobSpec()
        spec.model.warmup_steps = 0  # timing only
        ensure_model(spec.model, spec.task, Path(model_dir))
    base = {**os.environ, "WORLD_SIZE": str(args.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = [
        sys.executable,
        "-m",
        "trainer.bench",
        "--_rank",
        "--model-dir",
        model_dir,
        "--zero-stage",
        str(args.zero_stage),
        "--steps",
        str(args.steps),
    ]
    procs = [subprocess.Popen(cmd, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(args.ranks)]
    return max(proc.wait() for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
