"""Long-tail figures of issue 17: `rlboost local` (CPU) with and without length-aware offload, staleness 0 and 1.

    python bench/longtail_bench.py                                   # off-s0,on-s0, 2 repeats, rich tables
    python bench/longtail_bench.py --configs off-s0,on-s0,off-s1,on-s1 --repeats 3 --json longtail.json
    python bench/longtail_bench.py --offload-window 2 --steps 8 --out /tmp/longtail

The job is examples/local-longtail.yaml: an untrained tiny model with a large algorithm.maxNewTokens, so
response lengths are long-tailed (most stop early, a few run to the limit), 1 reserved + 2 spot workers.
Configurations (`--configs`, comma list):

* off-s0 / on-s0: `rollout.offloadWindowS` 0 (off) / `--offload-window` (length-aware offload: when the window
  elapses, the reserved worker's running requests move to spot, longest first; the window then adapts);
* off-s1 / on-s1: the same with `algorithm.maxStaleness: 1` and `algorithm.partialRollout: true`. A spec without
  `partialRollout` rejects them: they are skipped with a message saying so, the others still run.

Runs alternate by configuration (A, B, A, B, ... `--repeats` rounds), every run with the same seed, one at a time.
From each run: per-step wall-clock (the time between the trainer's consecutive "step done" log lines; step 0,
which includes workers loading, is excluded), samples per second over those steps, requests offloaded and
migrated (the manager's counters), lost samples (samples asked for and neither trained on nor skipped as stale:
must be 0) and the 1-minute load average before and after (the machine may be shared). Per configuration:
median and p90 of the pooled per-step wall-clock, samples/s, counts summed. `--json OUT` writes it all; a PNG of
per-step wall-clock per run (`longtail.png`) goes to `--out` with each run's config, report and run directory.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE_CONFIG = ROOT / "examples" / "local-longtail.yaml"
RUN_TIMEOUT_S = 900  # one run is a couple of minutes on 2 loaded cores; a hung one must not hold the bench


@dataclass(frozen=True)
class BenchConfig:
    """One configuration of the comparison."""

    name: str
    offload: bool  # length-aware offload on (rollout.offloadWindowS > 0)
    staleness: int  # algorithm.maxStaleness; > 0 also sets algorithm.partialRollout


CONFIGS = {
    c.name: c
    for c in (
        BenchConfig("off-s0", offload=False, staleness=0),
        BenchConfig("on-s0", offload=True, staleness=0),
        BenchConfig("off-s1", offload=False, staleness=1),
        BenchConfig("on-s1", offload=True, staleness=1),
    )
}


def parse_configs(text: str) -> list[BenchConfig]:
    """`off-s0,on-s0` -> the configurations, in that order; an unknown name is an error naming the choices."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        raise SystemExit(f"--configs: unknown {unknown or 'empty list'}; choose from {','.join(CONFIGS)}")
    return [CONFIGS[n] for n in dict.fromkeys(names)]


def spec_for(base: dict, config: BenchConfig, window_s: float, steps: int, seed: int) -> dict:
    """The job spec (camelCase mapping) of one configuration: the base with its offload and staleness fields."""
    spec = copy.deepcopy(base)
    algorithm, rollout = spec.setdefault("algorithm", {}), spec.setdefault("rollout", {})
    algorithm.update(steps=steps, seed=seed)
    rollout["offloadWindowS"] = window_s if config.offload else 0.0
    if config.staleness:
        algorithm.update(maxStaleness=config.staleness, partialRollout=True)
    return spec


def rejection(spec: dict) -> str:
    """Why this branch's JobSpec rejects the spec ('' when it accepts it)."""
    from rlboost.spec import JobSpecError, parse_job_spec

    try:
        parse_job_spec(spec, "bench spec")
    except JobSpecError as err:
        return str(err)
    return ""


def run_order(configs: list[BenchConfig], repeats: int) -> list[tuple[BenchConfig, int]]:
    """(configuration, repeat) in run order: A, B, A, B, ... so drifting machine load hits every configuration."""
    return [(c, r) for r in range(repeats) for c in configs]


def step_done_times(trainer_log: Path) -> dict[int, float]:
    """Step -> wall time (epoch seconds) of the trainer's "step done" log line."""
    times = {}
    for line in trainer_log.read_text().splitlines() if trainer_log.exists() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line a library printed, not the structured log
        if rec.get("msg") == "step done" and "step" in rec:
            times[int(rec["step"])] = float(rec["ts"])
    return times


def run_figures(report: dict, times: dict[int, float], samples_per_step: int, steps_asked: int) -> dict:
    """One run's figures from its JSON report and the trainer's step times (step 0 excluded: workers load).

    Lost samples: asked for (every step of the spec, so a run that died counts what it never delivered) and
    neither trained on nor skipped as too stale.
    """
    steps = sorted(times)
    walls = [round(times[b] - times[a], 3) for a, b in zip(steps, steps[1:], strict=False)]
    by_step = {s["step"]: s for s in report.get("steps", [])}
    timed = [by_step[s] for s in steps[1:] if s in by_step]
    samples = sum(s["trajectories"] for s in timed)
    asked = samples_per_step * steps_asked
    accounted = sum(s["trajectories"] + s["off_policy"] for s in report.get("steps", []))
    lengths = [s["response_length"] for s in report.get("steps", []) if s.get("response_length")]
    return {
        "ok": report.get("ok", False),
        "error": report.get("error", ""),
        "steps": len(report.get("steps", [])),
        "step_wall_seconds": walls,
        "samples_per_second": round(samples / sum(walls), 3) if walls else 0.0,
        "offloaded": report.get("migrations_by_reason", {}).get("offload", 0),
        "migrated": report.get("migrations", 0),
        "migrations_by_reason": report.get("migrations_by_reason", {}),
        "lost_samples": max(0, asked - accounted),
        "stale_samples": sum(s["stale"] for s in report.get("steps", [])),
        "off_policy_samples": sum(s["off_policy"] for s in report.get("steps", [])),
        "tokens_lost": report.get("tokens_lost", 0),
        "response_length_p50": _median([x["p50"] for x in lengths]),
        "response_length_p90": _median([x["p90"] for x in lengths]),
        "tokens": sum(s["tokens"] for s in report.get("steps", [])),
        "wall_seconds": report.get("wall_seconds", 0.0),
    }


def local_run(spec: dict, workdir: Path, label: str) -> dict:
    """Run `rlboost local` on `spec` (run directory, config, report and stdout under workdir/label)."""
    import yaml

    run_dir, config, report = workdir / label, workdir / f"{label}.yaml", workdir / f"{label}.report.json"
    config.write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", "--config", str(config)]
    cmd += ["--json-report", str(report), "--run-dir", str(run_dir)]
    load_before = os.getloadavg()[0]
    with open(workdir / f"{label}.stdout", "w") as out:
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S, check=False)
    figures = run_figures(
        json.loads(report.read_text()) if report.exists() else {"ok": False, "error": f"exit {done.returncode}"},
        step_done_times(run_dir / "logs" / "trainer.log"),
        spec["algorithm"]["promptsPerStep"] * spec["algorithm"]["groupSize"],
        spec["algorithm"]["steps"],
    )
    return figures | {"exit_code": done.returncode, "load_before": load_before, "load_after": os.getloadavg()[0]}


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else 0.0


def _p90(xs: list[float]) -> float:
    if len(xs) < 2:
        return _median(xs)
    return round(statistics.quantiles(xs, n=10, method="inclusive")[-1], 3)


def summarize(runs: list[dict]) -> dict:
    """Per-configuration figures from its runs: pooled per-step wall-clock, samples/s, counts summed."""
    walls = [w for r in runs for w in r["step_wall_seconds"]]
    return {
        "runs": len(runs),
        "ok_runs": sum(r["ok"] for r in runs),
        "timed_steps": len(walls),
        "step_wall_median_s": _median(walls),
        "step_wall_p90_s": _p90(walls),
        "samples_per_second": _median([r["samples_per_second"] for r in runs]),
        "offloaded": sum(r["offloaded"] for r in runs),
        "migrated": sum(r["migrated"] for r in runs),
        "lost_samples": sum(r["lost_samples"] for r in runs),
        "tokens_lost": sum(r["tokens_lost"] for r in runs),
        "response_length_p50": _median([r["response_length_p50"] for r in runs]),
        "response_length_p90": _median([r["response_length_p90"] for r in runs]),
        "load_avg_1m": _median([x for r in runs for x in (r["load_before"], r["load_after"])]),
    }


def plot(runs: list[dict], path: Path) -> None:
    """Per-step wall-clock of every run, one colour per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    colours: dict[str, str] = {}
    for run in runs:
        colour = colours.setdefault(run["config"], f"C{len(colours)}")
        walls = run["step_wall_seconds"]
        label = run["config"] if run["repeat"] == 0 else None
        ax.plot(range(1, len(walls) + 1), walls, marker="o", ms=3, color=colour, alpha=0.8, label=label)
    ax.set(xlabel="step", ylabel="wall-clock per step (s)", title="rlboost local, long-tailed responses")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench(args: argparse.Namespace) -> dict:
    """Run every accepted configuration `--repeats` times, alternating; returns the JSON figures."""
    import yaml

    base = yaml.safe_load(BASE_CONFIG.read_text())
    out = Path(args.out or tempfile.mkdtemp(prefix="rlboost-longtail-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    chosen = parse_configs(args.configs)
    specs = {c.name: spec_for(base, c, args.offload_window, args.steps, args.seed) for c in chosen}
    skipped = {name: why for name, spec in specs.items() if (why := rejection(spec))}
    for name, why in skipped.items():
        _console().print(f"[yellow]skipping {name}: this branch's spec rejects it ({' '.join(why.split())})[/]")
    configs = [c for c in chosen if c.name not in skipped]
    runs = []
    for config, repeat in _progress(run_order(configs, args.repeats), "rlboost local"):
        label = f"{config.name}-{repeat}"
        runs.append({"config": config.name, "repeat": repeat} | local_run(specs[config.name], out, label))
    if runs:
        plot(runs, out / "longtail.png")
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "base_config": str(BASE_CONFIG.relative_to(ROOT)),
        "steps": args.steps,
        "repeats": args.repeats,
        "seed": args.seed,
        "offload_window_s": args.offload_window,
        "skipped": skipped,
        "configs": {c.name: summarize([r for r in runs if r["config"] == c.name]) for c in configs},
        "runs": runs,
        "out": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="off-s0,on-s0", help=f"comma list of {','.join(CONFIGS)}")
    p.add_argument("--repeats", type=int, default=2, help="runs per configuration, alternating")
    p.add_argument("--steps", type=int, default=8, help="RL steps per run (step 0 is not timed)")
    p.add_argument("--offload-window", type=float, default=1.0, help="initial offload window (s) of the on-* runs")
    p.add_argument("--seed", type=int, default=0, help="algorithm.seed of every run")
    p.add_argument("--out", default="", help="directory for configs, reports, run dirs and the plot (default: temp)")
    p.add_argument("--json", default="", metavar="OUT", help="write the figures as JSON here")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.steps < 2 or args.offload_window <= 0:
        raise SystemExit("--repeats must be >= 1, --steps >= 2 (step 0 is not timed), --offload-window > 0")
    result = bench(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    return 0 if all(r["ok"] for r in result["runs"]) else 1


def _progress(items: list, what: str):
    """Yield the items while a progress bar on stderr shows how many are done."""
    from rich.progress import track

    yield from track(items, description=f"{what}…", transient=True, console=_console())


def _console():
    from rich.console import Console

    return Console(stderr=True, width=None if sys.stderr.isatty() else 120)  # a log keeps the whole table


def _print(result: dict) -> None:
    from rich.table import Table

    columns = {
        "runs": "runs",
        "step_wall_median_s": "step s p50",
        "step_wall_p90_s": "step s p90",
        "samples_per_second": "samples/s",
        "offloaded": "offloaded",
        "migrated": "migrated",
        "lost_samples": "lost",
        "response_length_p90": "len p90",
        "load_avg_1m": "load",
    }
    table = Table("config", *columns.values(), title="rlboost local, long-tailed responses")
    for name, s in result["configs"].items():
        table.add_row(name, *(str(s[k]) for k in columns))
    console = _console()
    console.print(table)
    console.print(f"runs, reports and plot: {result['out']}")


if __name__ == "__main__":
    sys.exit(main())
