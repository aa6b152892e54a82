"""What a preemption costs (issue 34), measured in a real `rlboost local` job on the default tiny model.

    python bench/preemption_bench.py                                  # a notice run and a silent run, rich tables
    python bench/preemption_bench.py --steps 6 --json preemption.json --plot preemption.png
    python bench/preemption_bench.py --kinds silent \\
        --trace ../shared/traces/bamboo/aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv
    python bench/preemption_bench.py --device cuda --kinds notice,silent,expired --steps 4 --timeout 300  # GPU lane

Each kind is one run of `--config` (default examples/local-preemption.yaml: its tiny model, 1 reserved + 2 spot
workers of capacity 8; responses of `--max-new-tokens`), with chaos on the spot pool, paced by the job's progress
(`--chaos-kill-every 1 --chaos-step-seconds 1`): a spot worker is preempted while it streams an unfinished
response, and the runner starts a new one in its place.

* `notice`: SIGTERM. The worker sends the manager a DrainNotice, flushes every token and exits (the path of a
  cloud preemption notice; a NATS notice from the operator drains the same way, with a DrainCommand).
* `silent`: SIGKILL. No notice: the manager sees the stream break and moves the requests with the tokens it holds.
* `expired`: SIGSTOP (`--chaos-signal STOP`). The worker freezes with its connections open, as a VM that vanished
  without a TCP reset: the manager finds it by lease expiry (`rollout.leaseTimeoutMs`) and moves its requests; a new
  worker replaces it at once. The manager records it as an `expired` preemption.
* `--trace`: a Bamboo trace replayed by the job's progress as well (`--trace-step-seconds`): workers the trace
  takes away are killed (SIGKILL).

Figures, from the manager's structured logs (bench/preemption_figures.py) and its /metrics (scraped while the job
runs): per preemption, notice -> drained seconds, tokens streamed / in flight / kept / lost (= regenerated), and
per moved request `resume_s` (hand-back -> next token on another worker) and `stalled_s` (last token kept -> next
token); per new spot worker, process start -> model assets / engine / weights -> ready -> first request
(`first_token_s`); per step, slot-seconds lost to preemptions and their share of the step's slot-seconds, as the
product reports them (the step reports' `preempted_slot_seconds`, `preempted_slot_share`), with the same recomputed
from the logs over the manager's rollout windows beside them (`steps_from_logs`, `slot_s_lost_agree`).
Beside them, tokens/s per worker by pool (`tokens_per_s_per_worker`: each step's `pool_tokens_per_second` over its
`pool_workers`, the median over the steps). `--device cuda` runs the trainer (NCCL) and every worker (torch engine)
on the CUDA GPU, all sharing it, as examples/local-gpu-torch.yaml does: `make test-gpu` runs it so (tests/gpu).
`--json PATH` writes them all with the machine, date and load; `--plot PATH` a PNG of the distributions and one
preemption's timeline.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import preemption_figures as figures  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "local-preemption.yaml"
SIGNALS = {"notice": "TERM", "silent": "KILL", "expired": "STOP"}
PREEMPTION_KIND = {"notice": "notice", "silent": "silent", "expired": "expired"}  # the manager's kind of each run's
RUN_TIMEOUT_S = 600  # a few minutes on 2 loaded cores; a hung run must not hold the bench (--run-timeout)
# --device cuda: the trainer on NCCL and each pool's workers on the torch engine, one GPU each (all share the one GPU)
CUDA = {"trainer": {"backend": "nccl", "gpusPerRank": 1}, "pool": {"engine": "torch", "gpusPerWorker": 1}}
POLL_S = 0.5  # progress display and /metrics scrapes (display only: figures come from the logs)


def job_config(out: Path, config: Path, max_new_tokens: int, device: str = "cpu") -> Path:
    """`config` (a job spec) with `max_new_tokens`-token responses (long enough to be preempted mid-response), its
    trainer and workers on `device` (cpu: as the spec says)."""
    import yaml

    spec = yaml.safe_load(config.read_text())
    spec.setdefault("algorithm", {})["maxNewTokens"] = max_new_tokens
    if device == "cuda":
        spec.setdefault("trainer", {}).update(CUDA["trainer"])
        for pool in ("reserved", "spot"):
            spec.setdefault("rollout", {}).setdefault(pool, {}).update(CUDA["pool"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return out / "job.yaml"


def local_command(kind: str, out: Path, args: argparse.Namespace) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "rlboost.cli.main",
        "local",
        "--config",
        str(job_config(out, args.config, args.max_new_tokens, args.device)),
    ]
    cmd += ["--steps", str(args.steps), "--temperature", "0", "--run-dir", str(out / "run")]
    cmd += ["--json-report", str(out / "report.json"), "--seed", str(args.seed)]
    cmd += ["--chaos-kill-every", "1", "--chaos-step-seconds", "1", "--chaos-signal", SIGNALS[kind]]
    if args.trace:
        cmd += ["--spot-trace", str(args.trace), "--trace-step-seconds", str(args.trace_step_seconds)]
    return cmd


def _scrape_manager(run_dir: Path) -> dict[str, float] | None:
    """The manager's preemption metrics now, or None (not up yet, or gone)."""
    try:
        port = json.loads((run_dir / "endpoints.json").read_text())["metrics_ports"]["rollout-manager"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return figures.scrape(resp.read().decode())
    except (OSError, ValueError, KeyError):
        return None


def run_kind(kind: str, out: Path, args: argparse.Namespace, progress) -> dict:
    """One `rlboost local` run with `kind` preemptions: its figures."""
    run_dir, log = out / "run", out / "local.log"
    out.mkdir(parents=True, exist_ok=True)
    task = progress.add_task(f"{kind}: starting", total=args.steps)
    metrics: dict[str, float] = {}
    with log.open("w") as sink:
        proc = subprocess.Popen(local_command(kind, out, args), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        deadline = min(time.monotonic() + args.run_timeout, args.deadline)
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.terminate()  # rlboost local stops its children on SIGTERM
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                bound = "--timeout (the runs together)" if deadline == args.deadline else "--run-timeout"
                raise SystemExit(f"{kind}: rlboost local ran past {bound}; see {log}")
            metrics = _scrape_manager(run_dir) or metrics
            manager_log = run_dir / "logs" / "rollout-manager.log"
            done = len(figures.step_windows(manager_log))
            n = len(figures.preemptions(manager_log))
            progress.update(task, completed=done, description=f"{kind}: {done} steps, {n} preemptions")
            time.sleep(POLL_S)
    if proc.returncode != 0:
        raise SystemExit(f"{kind}: rlboost local exited {proc.returncode}; see {log}")
    progress.update(task, completed=args.steps)
    return collect(kind, run_dir, out / "report.json", metrics)


def _rollout(run_dir: Path) -> dict:
    import yaml

    return yaml.safe_load((run_dir / "job.yaml").read_text())["rollout"]


def slots_of(run_dir: Path) -> int:
    """Request slots of the job's workers (reserved + spot replicas x capacity)."""
    rollout = _rollout(run_dir)
    return sum(rollout[p]["replicas"] * rollout[p]["capacity"] for p in ("reserved", "spot") if p in rollout)


def collect(kind: str, run_dir: Path, report_path: Path, metrics: dict[str, float]) -> dict:
    manager_log = run_dir / "logs" / "rollout-manager.log"
    report = json.loads(report_path.read_text())
    # a worker whose process started after the first step began joined a running job (replacing a preempted one,
    # or brought by the trace): the cost a preemption's replacement pays; those at the start wait for the trainer
    first_step = min((t0 for _, t0, _ in figures.step_windows(manager_log)), default=float("inf"))
    return {
        "kind": kind,
        "preemptions": figures.preemptions(manager_log),
        "new_workers": [
            {**w, "replacement": w.get("started_at", 0.0) > first_step} for w in figures.startups(run_dir / "logs")
        ],
        "steps": figures.steps_reported(report),
        "tokens_per_s_per_worker": tokens_per_worker(report.get("steps", [])),
        "steps_from_logs": figures.steps_lost(manager_log, slots_of(run_dir)),
        "metrics": metrics,
        "run_tokens_lost": report.get("tokens_lost"),  # fencing: tokens the trainer would have lost (must be 0)
        "run_tokens_regenerated": report.get("tokens_regenerated"),
        "run_dir": str(run_dir),
    }


def summary(runs: list[dict]) -> dict:
    """Per kind: medians and maxima over its preemptions, new workers and steps (the keys the table shows)."""
    out = {}
    for run in runs:
        ps = [p for p in run["preemptions"] if p["kind"] == PREEMPTION_KIND[run["kind"]]]
        resume = [s for p in ps for s in p["resume_s"]]
        out[run["kind"]] = {
            "kind": run["kind"],
            "preemptions": len(ps),
            "other_kind_preemptions": len(run["preemptions"]) - len(ps),  # e.g. a notice run's worker killed at last
            "notice_to_drained_s": _stats([p["notice_to_drained_s"] for p in ps]),
            "detected_after_s": _stats([p["detected_after_s"] for p in ps]),
            "tokens_in_flight": sum(p["tokens_in_flight"] for p in ps),
            "tokens_kept": sum(p["tokens_kept"] for p in ps),
            "tokens_lost": sum(p["tokens_lost"] for p in ps),
            "tokens_regenerated": sum(p["tokens_regenerated"] for p in ps),
            "resume_s": _stats(resume),
            "first_token_s": _stats([w.get("first_token_s") for w in run["new_workers"] if w["replacement"]]),
            # over the steps a preemption stalled (most steps have none), and the mean over every step
            "slot_share_lost": _stats([s["share"] for s in run["steps"] if s["slot_s_lost"] > 0]),
            "slot_share_lost_mean": statistics.fmean([s["share"] for s in run["steps"]] or [0.0]),
            "metrics_agree": _metrics_agree(run, ps),
            "tokens_per_s_per_worker": run["tokens_per_s_per_worker"],
            "slot_s_lost": round(sum(s["slot_s_lost"] for s in run["steps"]), 3),
            "slot_s_lost_from_logs": round(sum(s["slot_s_lost"] for s in run["steps_from_logs"]), 3),
        }
    return out


def tokens_per_worker(steps: list[dict]) -> dict[str, float]:
    """Per pool: the median over the steps of its tokens/s per worker (pool_tokens_per_second / pool_workers: the
    step reports' figures, over the whole step, training included)."""
    rates: dict[str, list[float]] = {}
    for s in steps:
        for pool, tps in (s.get("pool_tokens_per_second") or {}).items():
            workers = (s.get("pool_workers") or {}).get(pool, 0)
            if workers:
                rates.setdefault(pool, []).append(tps / workers)
    return {pool: round(statistics.median(xs), 1) for pool, xs in sorted(rates.items())}


def _metrics_agree(run: dict, ps: list[dict]) -> bool | None:
    """The manager's /metrics (last scrape) count the same preemptions and tokens as its log lines (None: no scrape)."""
    m, kind = run["metrics"], PREEMPTION_KIND[run["kind"]]
    if not m:
        return None
    tokens = lambda what: m.get(f'rlboost_manager_preempted_tokens_total{{kind="{kind}",what="{what}"}}', 0.0)  # noqa: E731
    return (
        m.get(f'rlboost_manager_preemptions_total{{kind="{kind}"}}', 0.0) == len(ps)
        and tokens("kept") == sum(p["tokens_kept"] for p in ps)
        and tokens("lost") == sum(p["tokens_lost"] for p in ps)
    )


def _stats(values: list) -> dict:
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": statistics.median(xs), "max": xs[-1]}


def no_cuda() -> str | None:
    """Why the workers cannot run on CUDA here, or None."""
    import torch

    if not torch.cuda.is_available():
        return f"no CUDA GPU here (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def device_name(device: str) -> str:
    if device != "cuda":
        return "cpu"
    import torch

    return f"cuda: {torch.cuda.get_device_name(0)}"


def machine() -> dict:
    return {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
    }


def print_tables(runs: list[dict], summ: dict, console) -> None:
    from rich.table import Table

    t = Table(title="What a preemption costs (per preemption; medians, max)")
    for col in (
        "kind",
        "n",
        "notice→drained s",
        "detected s",
        "in flight",
        "kept",
        "lost=regen",
        "resume s",
        "new worker→1st request s",
        "slot share lost, steps hit",
        "/metrics = logs",
        "tokens/s per worker",
    ):
        t.add_column(col, justify="right")
    for kind, s in summ.items():
        t.add_row(
            kind,
            str(s["preemptions"]),
            _fmt(s["notice_to_drained_s"]),
            _fmt(s["detected_after_s"]),
            str(s["tokens_in_flight"]),
            str(s["tokens_kept"]),
            str(s["tokens_lost"]),
            _fmt(s["resume_s"]),
            _fmt(s["first_token_s"]),
            _fmt(s["slot_share_lost"], pct=True),
            str(s["metrics_agree"]),
            ", ".join(f"{pool} {tps:g}" for pool, tps in s["tokens_per_s_per_worker"].items()) or "-",
        )
    console.print(t)
    w = Table(title="New spot workers: process start → parts → first request (s)")
    for col in ("run", *figures.STARTUP_KEYS, "replacement"):
        w.add_column(col, justify="right")
    for run in runs:
        for s in run["new_workers"]:
            w.add_row(run["kind"], *(str(s.get(k, "-")) for k in figures.STARTUP_KEYS), str(s["replacement"]))
    console.print(w)


def _fmt(s: dict, pct: bool = False) -> str:
    if not s.get("n"):
        return "-"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
    return f"{f(s['median'])} ({f(s['max'])})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--kinds", default="notice,silent", help="comma list of notice (SIGTERM), silent (SIGKILL), expired (SIGSTOP)"
    )
    p.add_argument("--steps", type=int, default=10, help="training steps per run (replaced workers start meanwhile)")
    p.add_argument("--config", type=Path, default=CONFIG, help="the job spec (default: the preemption example)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="response length (long: preempted mid-response)")
    p.add_argument("--trace", type=Path, help="a Bamboo spot trace to replay as well (by the job's progress)")
    p.add_argument("--trace-step-seconds", type=float, default=100.0, help="trace seconds per step of progress")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the trainer and workers run")
    p.add_argument(
        "--run-timeout", type=float, default=RUN_TIMEOUT_S, help="seconds each kind's run may take (then it stops)"
    )
    p.add_argument("--timeout", type=float, help="seconds the runs may take together (a run stops at either bound)")
    p.add_argument("--out", type=Path, help="where the runs go (default: a temporary directory)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--plot", type=Path, help="write a PNG of the distributions and one preemption's timeline")
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds or any(k not in SIGNALS for k in kinds):
        p.error(f"--kinds {args.kinds!r}: give a comma list of {', '.join(SIGNALS)}")
    if not args.config.is_file():
        p.error(f"--config {args.config}: no such file")
    if args.trace is not None and not args.trace.is_file():
        p.error(f"--trace {args.trace}: no such file (Bamboo traces: /work/shared/traces/bamboo/)")
    for flag, value in (("--timeout", args.timeout), ("--run-timeout", args.run_timeout)):
        if value is not None and value <= 0:
            p.error(f"{flag} {value:g}: give seconds > 0")
    if args.device == "cuda" and (problem := no_cuda()):
        p.error(f"--device cuda: {problem}")
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    console = Console(width=max(Console().width, 150))  # the tables' columns, also when written to a file
    out = args.out or Path(tempfile.mkdtemp(prefix="preemption-bench-"))
    args.deadline = time.monotonic() + args.timeout if args.timeout else float("inf")
    before = machine()
    with Progress(SpinnerColumn(), *Progress.get_default_columns(), TimeElapsedColumn(), console=console) as progress:
        runs = [run_kind(kind, out / kind, args, progress) for kind in kinds]
    summ = summary(runs)
    print_tables(runs, summ, console)
    result = {**before, "load_after": os.getloadavg(), "steps": args.steps, "trace": str(args.trace or "")}
    result |= {"device": device_name(args.device)}
    result |= {"max_new_tokens": args.max_new_tokens, "summary": summ, "runs": runs}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
        console.print(f"json: {args.json}")
    if args.plot:
        from preemption_plot import plot

        plot(runs, args.plot)
        console.print(f"plot: {args.plot}")
    console.print(f"runs: {out}  load {before['load']} -> {result['load_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
