"""The figures of bench/preemption_bench.py, read from one `rlboost local` run's directory (pure: files in, dicts out).

The rollout-manager logs one "preemption cost" line per preempted worker and one "moved request resumed" line per
request a preemption moved (services/rollout-manager/rollout_manager/preemption_costs.py); each worker logs its
"start-up" split and its "first assignment" (services/rollout-worker/rollout_worker/startup.py); the manager's
"rollout step started" / "rollout step delivered" lines bound each step. Every line is JSON with a wall-clock `ts`.

The per-step share lost is the product's own figure (`steps_reported`: the trainer's step reports, whose
`preempted_slot_seconds` / `rollout_slot_seconds` come from the manager's ledger); `steps_lost` recomputes it from the
logs over the manager's rollout windows, a cross-check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

PREEMPTION_KEYS = (
    "kind",
    "worker_id",
    "notice_to_drained_s",
    "detected_after_s",
    "requests",
    "tokens_streamed",
    "tokens_in_flight",
    "tokens_kept",
    "tokens_lost",
    "tokens_regenerated",
    "resume_s",
    "stalled_s",
)
STARTUP_KEYS = ("worker_id", "process_s", "assets_s", "engine_s", "weights_s", "ready_s", "first_token_s")
SPOT_LOG = re.compile(r"spot-\d+\.log$")


def log_lines(path: Path) -> Iterator[dict]:
    """The JSON lines of a service log (progress bars and other text skipped)."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def preemptions(manager_log: Path) -> list[dict]:
    """One dict per preempted worker: the manager's figures, with its moved requests' resume and stall seconds."""
    lines = list(log_lines(manager_log))
    resumed = {d["request_id"]: d for d in lines if d.get("msg") == "moved request resumed"}
    notices = {d["worker_id"]: d["ts"] for d in lines if d.get("msg") == "preemption notice received"}
    out = []
    for d in (d for d in lines if d.get("msg") == "preemption cost"):
        moved = [resumed[rid] for rid in d.get("request_ids", []) if rid in resumed]
        out.append(
            {
                **{k: d.get(k) for k in PREEMPTION_KEYS if k in d},
                "tokens_regenerated": d.get("tokens_lost", 0),  # the next worker generates the lost tokens again
                "resume_s": [r["resume_s"] for r in moved],
                "stalled_s": [r["stalled_s"] for r in moved],
                "drained_at": d["ts"],
                "notice_at": notices.get(d["worker_id"]) if d.get("kind") == "notice" else None,
                "resumed_at": [r["ts"] for r in moved],
            }
        )
    return out


def startups(log_dir: Path) -> list[dict]:
    """Per spot worker process: its start-up parts and the seconds from its process start to its first request."""
    out = []
    for path in sorted(p for p in log_dir.iterdir() if SPOT_LOG.search(p.name)):
        split: dict = {"worker_id": path.stem, "index": int(path.stem.rsplit("-", 1)[1])}
        for d in log_lines(path):
            if d.get("msg") == "start-up":
                split.update({k: d[k] for k in STARTUP_KEYS[1:-1] if k in d})
                split["started_at"] = d["ts"] - d.get("ready_s", 0.0)  # the process's start, wall clock
            elif d.get("msg") == "first assignment":
                split["first_token_s"] = d["first_assignment_s"]
        if len(split) > 2:
            out.append(split)
    return out


def step_windows(manager_log: Path) -> list[tuple[int, float, float]]:
    """(step, started, delivered) wall-clock times of each step the manager delivered."""
    started: dict[int, float] = {}
    out = []
    for d in log_lines(manager_log):
        if d.get("msg") == "rollout step started":
            started.setdefault(d["step"], d["ts"])
        elif d.get("msg") == "rollout step delivered" and d["step"] in started:
            out.append((d["step"], started[d["step"]], d["ts"]))
    return out


def steps_lost(manager_log: Path, slots: int) -> list[dict]:
    """Per step: slot-seconds preempted requests spent stalled (from their last token kept to their next token
    elsewhere) inside the step, and their share of the step's slot-seconds (`slots` request slots x its seconds)."""
    stalls = [
        (d["ts"] - d["stalled_s"], d["ts"]) for d in log_lines(manager_log) if d.get("msg") == "moved request resumed"
    ]
    out = []
    for step, t0, t1 in step_windows(manager_log):
        lost = sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in stalls)
        span = max(t1 - t0, 1e-9)
        out.append(
            {"step": step, "step_s": round(span, 3), "slot_s_lost": round(lost, 3), "share": lost / (span * slots)}
        )
    return out


def steps_reported(report: dict) -> list[dict]:
    """Per step, as the product reports it (`rlboost local --json-report`'s steps[], the lines of steps.jsonl): the
    slot-seconds preemptions cost since the previous step and their share of the fleet's slot-seconds."""
    return [
        {
            "step": s["step"],
            "step_s": round(s["rollout_seconds"] + s["train_seconds"] + s["sync_seconds"], 3),
            "preemptions": s.get("preemptions", 0),
            "slot_s_lost": round(s.get("preempted_slot_seconds", 0.0), 3),
            "slot_s": round(s.get("rollout_slot_seconds", 0.0), 3),
            "share": s.get("preempted_slot_share", 0.0),
        }
        for s in report.get("steps", [])
    ]


def scrape(text: str, prefix: str = "rlboost_manager_preempt") -> dict[str, float]:
    """The samples of a Prometheus text page whose names start with `prefix` ("name{labels}" -> value)."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix) or line.startswith("rlboost_manager_migration_resume"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    """Read an earlier run's figures again, without running anything: `python bench/preemption_figures.py RUN_DIR`."""
    import argparse

    p = argparse.ArgumentParser(description="The preemption figures of one `rlboost local` run directory, as JSON.")
    p.add_argument("run_dir", type=Path, help="the run directory (its logs/rollout-manager.log and logs/)")
    p.add_argument("--slots", type=int, default=0, help="request slots of the run's workers (per-step share lost)")
    args = p.parse_args(argv)
    manager_log = args.run_dir / "logs" / "rollout-manager.log"
    if not manager_log.is_file():
        p.error(f"{manager_log} not found: give the run directory of an `rlboost local` run")
    out = {"preemptions": preemptions(manager_log), "startups": startups(args.run_dir / "logs")}
    if args.slots:
        out["steps"] = steps_lost(manager_log, args.slots)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
