"""Step-time benchmark of the trainer's compute on the default example's batch shape (no network peers).

    python -m trainer.bench --ranks 2 --zero-stage 2 [--steps 3] [--model-dir DIR] [--set lossAggregation=token-mean]

Spawns one process per rank (gloo rendezvous on loopback); each trains its share of a synthetic step
(promptsPerStep x groupSize samples of the default job spec, prompt 24 + response maxNewTokens tokens, worker
log-probs near the trainer's) in micro-batches, then the optimizer update(s) and the extraction of the bf16 state to
publish. `--set` (repeatable) changes an `algorithm` field, camelCase, dotted for nested ones
(`rolloutCorrection.mode=tis`): the step runs the path that option takes (klInReward: its scoring pass first;
updatesPerStep: the replays). Rank 0 prints one JSON line: the median seconds per step of the scoring pass,
forward/backward, optimizer update(s), state extraction, and the total, and the CPU seconds of the step (all of the
process's threads: what a shared machine's load does not inflate).
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


def bench_spec(settings: list[str], world: int, zero: int):
    """The default job spec with `algorithm` fields set from KEY=VALUE (VALUE read as YAML)."""
    import yaml

    from rlboost.spec import JobSpec, parse_job_spec

    algorithm: dict = {}
    for item in settings:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = algorithm
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = yaml.safe_load(value)
    spec = parse_job_spec({**JobSpec().model_dump(by_alias=True, mode="json"), "algorithm": algorithm}, "--set")
    spec.trainer.ranks, spec.trainer.zero_stage = world, zero
    return spec


def _rank_main(model_dir: str, zero: int, steps: int, settings: list[str]) -> None:
    import torch

    from rlboost.spec import effective_micro_batch
    from rlboost.wire.rollout_io import Trajectory
    from trainer.grpo import Sample, collate
    from trainer.training import StepTrainer

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    spec = bench_spec(settings, world, zero)
    training = StepTrainer(Path(model_dir), spec, pad_id=0)
    training.start()
    engine = training.engine
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
                [],  # the worker's log-probs: set below, near the trainer's
                "length",
                0,
            ),
            reward=0.0,
            advantage=float(i % 2) - 0.5,
        )
        for i in range(batch // world)
    ]
    n = alg.max_new_tokens
    for i in range(0, len(samples), micro):  # the workers' log-probs: the trainer's, off by up to +-0.01
        part = samples[i : i + micro]
        with torch.no_grad():
            lp = engine.logprobs(collate(part, 0).to(engine.device))[:, -n:].cpu()
        for s, row in zip(part, lp, strict=True):
            s.trajectory.logprobs = (row + 0.02 * (torch.rand(n, generator=g) - 0.5)).tolist()
    mbs = [collate(samples[i : i + micro], 0) for i in range(0, len(samples), micro)]
    rows = []
    for _ in range(steps):
        t0, cpu0 = time.perf_counter(), time.process_time()
        if alg.kl_in_reward:  # the scoring pass: each row's KL to the reference (trainer.training.penalise_kl)
            for mb in mbs:
                engine.sequence_kl(mb)
        t1 = time.perf_counter()
        loss, stats = 0.0, None
        for mb in mbs:
            more_loss, more = engine.forward_backward(mb, batch)
            loss, stats = loss + more_loss, more if stats is None else stats + more
        t2 = time.perf_counter()
        training.update(loss, stats)  # the optimizer update(s): replays with updatesPerStep > 1
        t3 = time.perf_counter()
        engine.publish_state()  # the bf16 state to publish (per-partition extraction under ZeRO-3)
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0, time.process_time() - cpu0))
    if rank == 0:
        keep = rows[1:] or rows  # the first step includes warm-up
        med = [round(statistics.median(r[i] for r in keep), 3) for i in range(6)]
        keys = ("score_s", "fwd_bwd_s", "optimizer_s", "extract_s", "step_s", "step_cpu_s")
        print(json.dumps({"ranks": world, "zero_stage": zero, "set": settings, **dict(zip(keys, med, strict=True))}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--zero-stage", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads per rank (OMP_NUM_THREADS); 0 = torch's own")
    p.add_argument("--model-dir", default="", help="default: the default example's tiny model, created once")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an algorithm field, e.g. updatesPerStep=2"
    )
    p.add_argument("--_rank", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._rank:
        _rank_main(args.model_dir, args.zero_stage, args.steps, args.set)
        return 0
    from rlboost.spec import JobSpecError

    try:
        bench_spec(args.set, args.ranks, args.zero_stage)
    except JobSpecError as err:  # a bad --set: one message naming the field
        print(f"python -m trainer.bench: {err}", file=sys.stderr)
        return 2
    from rlboost.nats_server import free_port

    model_dir = args.model_dir or str(Path("runs/bench-model").resolve())
    if not (Path(model_dir) / "config.json").exists():
        from rlboost.models import ensure_model
        from rlboost.spec import JobSpec

        spec = JobSpec()
        spec.model.warmup_steps = 0  # timing only
        ensure_model(spec.model, spec.task, Path(model_dir))
    base = {**os.environ, "WORLD_SIZE": str(args.ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    if args.threads:  # one thread: the step's CPU seconds are its work, not OpenMP spinning on a loaded machine
        base["OMP_NUM_THREADS"] = str(args.threads)
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
        *(f"--set={item}" for item in args.set),
    ]
    procs = [subprocess.Popen(cmd, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(args.ranks)]
    return max(proc.wait() for proc in procs)


if __name__ == "__main__":
    sys.exit(main())
