"""Step time with each algorithm option of issue 32 (docs/algorithms.md), against today's GRPO defaults.

    .venv/bin/python bench/algorithms_bench.py                      # every option, rich table
    .venv/bin/python bench/algorithms_bench.py --only token-mean,updates-2 --steps 6 --json

Each row is one `python -m trainer.bench --set ...` (real DeepSpeed ranks on gloo, the default example's batch and
tiny model, workers' log-probs near the trainer's): median seconds per step of the klInReward scoring pass,
forward/backward over the step's micro-batches, the optimizer update(s), the extraction of the bf16 state, and the
total, with the total's ratio to the defaults' row (run first, in the same invocation), and the step's CPU seconds
(all threads of the process; on a shared machine the wall time mostly measures the others' load). One torch thread
per rank by default (`--threads`), so the CPU seconds are the step's work, not OpenMP threads spinning for a core. Compute only: batch
normalisation and klInReward also hold training until the rollout is complete, a cost that shows in a whole run's
`trainer_idle_seconds`, not here. The load average is printed with the figures (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OPTIONS: dict[str, list[str]] = {
    "defaults": [],
    "token-mean": ["lossAggregation=token-mean"],
    "token": ["lossAggregation=token"],
    "batch-norm": ["advantageNormalization=batch"],
    "gspo": ["importanceRatio=sequence"],
    "dual-clip": ["dualClip=3"],
    "tis-token": ["rolloutCorrection.mode=tis"],
    "mask-sequence": ["rolloutCorrection.mode=mask", "rolloutCorrection.level=sequence"],
    "kl-k3-loss": ["klCoef=0.01"],
    "kl-k1-loss": ["klCoef=0.01", "klEstimator=k1"],
    "kl-in-reward": ["klCoef=0.01", "klInReward=true"],
    "updates-2": ["updatesPerStep=2"],
}


def run(name: str, ranks: int, zero: int, steps: int, threads: int) -> dict:
    cmd = [sys.executable, "-m", "trainer.bench", "--ranks", str(ranks), "--zero-stage", str(zero)]
    cmd += ["--threads", str(threads)]
    cmd += ["--steps", str(steps), *(f"--set={s}" for s in OPTIONS[name])]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return {"option": name, **json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help=f"comma-separated option names (default all): {', '.join(OPTIONS)}")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--zero", type=int, default=1, choices=[0, 1, 2, 3])
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per row (the first is not counted)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank; 0 = torch's own (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--out", default="", help="also append each row to this file as a JSON line, as it completes")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(OPTIONS)
    unknown = [n for n in names if n not in OPTIONS]
    if unknown:
        p.error(f"--only: unknown option(s) {unknown}; choose from {', '.join(OPTIONS)}")
    names = ["defaults", *(n for n in names if n != "defaults")]
    load_before = os.getloadavg()
    rows = []
    for name in names:
        rows.append(run(name, args.ranks, args.zero, args.steps, args.threads))
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps({**rows[-1], "loadavg": os.getloadavg()}) + "\n")
    base, base_cpu = rows[0]["step_s"], rows[0]["step_cpu_s"]
    for r in rows:
        r["vs_defaults"] = round(r["step_s"] / base, 2) if base else None
        r["cpu_vs_defaults"] = round(r["step_cpu_s"] / base_cpu, 2) if base_cpu else None
    result = {"rows": rows, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"step time per option: {args.ranks} rank(s), ZeRO-{args.zero}, median of {args.steps - 1} steps")
    cols = ("score s", "fwd/bwd s", "optimizer s", "extract s", "step s", "x defaults", "step CPU s", "x defaults")
    for col in ("option", "--set", *cols):
        t.add_column(col, justify="left" if col in ("option", "--set") else "right")
    for r in rows:
        cells = (r["score_s"], r["fwd_bwd_s"], r["optimizer_s"], r["extract_s"], r["step_s"], r["vs_defaults"])
        cells += (r["step_cpu_s"], r["cpu_vs_defaults"])
        t.add_row(r["option"], " ".join(OPTIONS[r["option"]]) or "-", *map(str, cells))
    console = Console()
    console.print(t)
    console.print(f"load average before {load_before}, after {result['loadavg_after']} on {result['cpus']} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
