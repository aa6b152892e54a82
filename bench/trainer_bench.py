"""Trainer figures of issue 5: step time per ranks x ZeRO stage, and the gain from streamed consumption.

    .venv/bin/python bench/trainer_bench.py                    # both parts, rich tables
    .venv/bin/python bench/trainer_bench.py --part steps --ranks 1,2 --zero 1,2,3
    .venv/bin/python bench/trainer_bench.py --part streamed --steps 20 --json

`steps`: one `python -m trainer.bench --ranks R --zero-stage Z` per cell (real DeepSpeed ranks on gloo,
the default example's batch): median seconds of forward/backward, optimizer step, extraction of the bf16 state to publish, total.

`streamed`: two real `rlboost local` runs of the default example, `trainer.streamTraining` true and false,
same seed; from each run's JSON report, per step (step 0 excluded: workers load) the mean of rank 0's idle
time (request -> optimizer step, no compute), rollout time and the step's wall split. A plot of the idle
time per step of both runs is written next to the reports (`streamed.png`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def step_time(ranks: int, zero: int, steps: int) -> dict:
    cmd = [sys.executable, "-m", "trainer.bench", "--ranks", str(ranks), "--zero-stage", str(zero)]
    out = subprocess.run([*cmd, "--steps", str(steps)], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def local_run(streamed: bool, steps: int, workdir: Path) -> list[dict]:
    config = workdir / f"stream-{streamed}.yaml"
    config.write_text(f"trainer:\n  streamTraining: {str(streamed).lower()}\n")
    report = workdir / f"report-{streamed}.json"
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", "--config", str(config), "--steps", str(steps)]
    cmd += ["--json-report", str(report), "--run-dir", str(workdir / f"run-{streamed}")]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return json.loads(report.read_text())["steps"]


def summarize(steps: list[dict]) -> dict:
    keep = steps[1:] or steps  # step 0 includes workers loading and pulling version 0
    mean = lambda key: round(statistics.fmean(s[key] for s in keep), 3)  # noqa: E731
    keys = ("trainer_idle_seconds", "train_compute_seconds", "rollout_seconds", "train_seconds", "sync_seconds")
    return {k: mean(k) for k in keys} | {"steps": len(keep)}


def plot(runs: dict[bool, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for streamed, steps in runs.items():
        ax.plot(
            [s["step"] for s in steps[1:]],
            [s["trainer_idle_seconds"] for s in steps[1:]],
            label=f"streamTraining: {str(streamed).lower()}",
        )
    ax.set(xlabel="step", ylabel="trainer idle (s)", title="Rank 0 idle time per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["steps", "streamed", "all"], default="all")
    p.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    p.add_argument("--zero", default="1,2,3", help="comma-separated ZeRO stages")
    p.add_argument("--bench-steps", type=int, default=4, help="optimizer steps per step-time cell")
    p.add_argument("--steps", type=int, default=20, help="RL steps per streamed/unstreamed local run")
    p.add_argument("--out", default="", help="directory for reports and the plot (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = p.parse_args(argv)
    result: dict = {}
    if args.part in ("steps", "all"):
        cells = [(r, z) for r in map(int, args.ranks.split(",")) for z in map(int, args.zero.split(","))]
        result["step_time"] = [step_time(r, z, args.bench_steps) for r, z in _progress(cells, "trainer.bench")]
    if args.part in ("streamed", "all"):
        out = Path(args.out or tempfile.mkdtemp(prefix="rlboost-trainer-bench-"))
        out.mkdir(parents=True, exist_ok=True)
        runs = {s: local_run(s, args.steps, out) for s in _progress([True, False], "rlboost local")}
        plot(runs, out / "streamed.png")
        result["streamed"] = {str(s).lower(): summarize(steps) for s, steps in runs.items()} | {"plot": str(out)}
    _print(result, args.json)
    return 0


def _progress(items: list, what: str):
    """Yield the items while a progress bar on stderr shows how many are done."""
    from rich.progress import track

    yield from track(items, description=f"{what}…", transient=True, console=_console())


def _console():
    from rich.console import Console

    return Console(stderr=True)


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    from rich.table import Table

    console = _console()
    if "step_time" in result:
        table = Table("ranks", "ZeRO", "fwd+bwd s", "optimizer s", "extract s", "step s", title="Trainer step time")
        for c in result["step_time"]:
            table.add_row(
                *(str(c[k]) for k in ("ranks", "zero_stage", "fwd_bwd_s", "optimizer_s", "extract_s", "step_s"))
            )
        console.print(table)
    if "streamed" in result:
        table = Table("streamTraining", "idle s/step", "compute s/step", "rollout s", "train s", "sync s")
        for name, s in result["streamed"].items():
            if name != "plot":
                keys = (
                    "trainer_idle_seconds",
                    "train_compute_seconds",
                    "rollout_seconds",
                    "train_seconds",
                    "sync_seconds",
                )
                table.add_row(name, *(str(s[k]) for k in keys))
        console.print(table)
        console.print(f"plot and reports: {result['streamed']['plot']}")


if __name__ == "__main__":
    sys.exit(main())
