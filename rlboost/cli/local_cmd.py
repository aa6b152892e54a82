"""`rlboost local`: the whole job on this machine, every service a separate process on 127.0.0.1.

    rlboost local [--config FILE] [--steps N] [--json-report PATH] [--run-dir DIR] [--temperature T]
                  [--spot-trace FILE] [--trace-time-scale X | --trace-step-seconds X]
                  [--chaos-kill-every S [--chaos-step-seconds X]] [--chaos-signal KILL|TERM|STOP]
                  [--chaos-targets spot,reserved,manager,weight-server,nats,trainer]
                  [--dump-rollouts PATH]
                  [--workers-reserved N] [--workers-spot N] [--seed S]
                  [--trainer-ranks N] [--checkpoint-dir DIR] [--resume]

Exit codes: 0 done, 1 a child or the job failed, 2 bad input, 130/143 interrupted (SIGINT/SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rlboost.spec import JobSpec, JobSpecError, load_job_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "local",
        help="run a whole job locally (NATS, weight-server, manager, workers, trainer as processes)",
        description="Start every service as a separate process on 127.0.0.1, show live progress, "
        "stop everything on completion, Ctrl-C or any child's failure.",
    )
    p.add_argument("--config", type=Path, help="job spec YAML (default: the embedded default, examples/local.yaml)")
    p.add_argument("--steps", type=int, help="override algorithm.steps")
    p.add_argument("--temperature", type=float, help="override algorithm.temperature (0 = greedy)")
    p.add_argument("--seed", type=int, help="override algorithm.seed; also seeds chaos victim choice")
    p.add_argument("--engine", choices=["torch", "sglang"], help="override rollout.{reserved,spot}.engine")
    p.add_argument("--workers-reserved", type=int, metavar="N", help="override rollout.reserved.replicas")
    p.add_argument("--workers-spot", type=int, metavar="N", help="override rollout.spot.replicas")
    p.add_argument("--trainer-ranks", type=int, metavar="N", help="override trainer.ranks (N trainer processes)")
    p.add_argument("--checkpoint-dir", type=Path, metavar="DIR", help="trainer checkpoints go here")
    p.add_argument(
        "--resume", action="store_true", help="continue from the newest valid checkpoint in --checkpoint-dir"
    )
    p.add_argument("--json-report", type=Path, metavar="PATH", help="write the run's JSON report here")
    p.add_argument("--run-dir", type=Path, metavar="DIR", help="run directory (default: runs/<timestamp>)")
    p.add_argument("--dump-rollouts", type=Path, metavar="PATH", help="trainer writes every sample as a JSON line")
    p.add_argument("--spot-trace", type=Path, metavar="FILE", help="spot pool size follows this Bamboo-format trace")
    p.add_argument(
        "--trace-time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="replay the trace in wall time: trace seconds per wall second (default 1)",
    )
    p.add_argument(
        "--trace-step-seconds",
        type=float,
        metavar="X",
        help="replay the trace by the job's progress instead: each step's samples advance it X trace "
        "seconds, so its events land at the same point of the job on any machine",
    )
    p.add_argument(
        "--chaos-kill-every",
        type=float,
        metavar="S",
        help="preempt a spot worker caught streaming an unfinished response: the first as soon as one "
        "streams, then at most once every S seconds",
    )
    p.add_argument(
        "--chaos-step-seconds",
        type=float,
        metavar="X",
        help="measure --chaos-kill-every on the job's progress instead of the wall clock: each step's "
        "finished samples count X seconds, so kills land at the same points of the job on any "
        "machine",
    )
    p.add_argument(
        "--chaos-signal",
        choices=["KILL", "TERM", "STOP"],
        default="KILL",
        help="chaos preemption without notice (KILL, default), with notice (TERM: the worker drains), or a spot "
        "worker frozen with its connections open, as a VM that vanished (STOP: the manager finds it by lease expiry)",
    )
    p.add_argument(
        "--chaos-targets",
        default="spot",
        metavar="ROLES",
        help="comma list of the roles chaos kills, each caught at work: spot, reserved, manager, "
        "weight-server, nats, trainer (default spot); all but spot workers are restarted with "
        "the same ports and arguments, the trainer with --resume",
    )
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[tuple[str, str], object]:
    """(section, field) -> value for every flag that overrides the spec."""
    pairs = {
        ("algorithm", "steps"): args.steps,
        ("algorithm", "temperature"): args.temperature,
        ("algorithm", "seed"): args.seed,
        ("reserved", "replicas"): args.workers_reserved,
        ("spot", "replicas"): args.workers_spot,
        ("trainer", "ranks"): getattr(args, "trainer_ranks", None),
        ("reserved", "engine"): getattr(args, "engine", None),
        ("spot", "engine"): getattr(args, "engine", None),
    }
    return {k: v for k, v in pairs.items() if v is not None}


_FLAG = {
    ("algorithm", "steps"): "--steps",
    ("algorithm", "temperature"): "--temperature",
    ("algorithm", "seed"): "--seed",
    ("reserved", "replicas"): "--workers-reserved",
    ("spot", "replicas"): "--workers-spot",
    ("trainer", "ranks"): "--trainer-ranks",
    ("reserved", "engine"): "--engine",
    ("spot", "engine"): "--engine",
}


def resolve_spec(args: argparse.Namespace) -> JobSpec:
    """The job spec with flag overrides applied; JobSpecError names the flag and the allowed values."""
    spec = load_job_spec(args.config) if args.config else JobSpec()
    data = spec.model_dump()
    for (section, name), value in _overrides(args).items():
        target = data["rollout"][section] if section in ("reserved", "spot") else data[section]
        target[name] = value
    try:
        resolved = JobSpec.model_validate(data)
    except ValueError as err:
        raise JobSpecError(_override_error(err)) from None
    pool = resolved.rollout.spot
    if args.workers_spot is not None and not pool.min_replicas <= args.workers_spot <= pool.max_replicas:
        raise JobSpecError(
            f"--workers-spot: {args.workers_spot} is outside rollout.spot minReplicas..maxReplicas "
            f"({pool.min_replicas}..{pool.max_replicas}); change the flag or the config"
        )
    return resolved


def _override_error(err: ValueError) -> str:
    from pydantic import ValidationError

    if not isinstance(err, ValidationError):
        return str(err)
    lines = []
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        key = (loc[1], loc[2]) if loc[:1] == ("rollout",) and len(loc) > 2 else loc[:2]
        flag = _FLAG.get(key)
        msg = e["msg"].removeprefix("Value error, ")
        if not loc:  # a cross-field rule of the whole spec: its message names the fields
            lines.append(msg)
            continue
        lines.append(f"{flag + ' (' if flag else ''}{'.'.join(loc)}{')' if flag else ''}: {msg}")
    return "invalid value: " + "; ".join(lines)


def _check_inputs(args: argparse.Namespace) -> None:
    if args.trace_time_scale <= 0:
        raise JobSpecError(f"--trace-time-scale: must be > 0, got {args.trace_time_scale}")
    if args.trace_step_seconds is not None and args.trace_step_seconds <= 0:
        raise JobSpecError(f"--trace-step-seconds: must be > 0 trace seconds per step, got {args.trace_step_seconds}")
    if args.trace_step_seconds is not None and args.spot_trace is None:
        raise JobSpecError("--trace-step-seconds replays a trace: give the trace with --spot-trace FILE")
    if args.chaos_kill_every is not None and args.chaos_kill_every <= 0:
        raise JobSpecError(f"--chaos-kill-every: must be > 0 seconds, got {args.chaos_kill_every}")
    chaos_step_seconds = getattr(args, "chaos_step_seconds", None)
    if chaos_step_seconds is not None and chaos_step_seconds <= 0:
        raise JobSpecError(f"--chaos-step-seconds: must be > 0 seconds per step, got {chaos_step_seconds}")
    if chaos_step_seconds is not None and args.chaos_kill_every is None:
        raise JobSpecError("--chaos-step-seconds paces chaos: give its period with --chaos-kill-every S")
    if args.spot_trace is not None:
        from rlboost.local.spot_trace import load_trace

        load_trace(args.spot_trace)  # raises TraceError naming the line
    if getattr(args, "resume", False) and getattr(args, "checkpoint_dir", None) is None:
        raise JobSpecError("--resume needs --checkpoint-dir DIR (the directory the earlier run checkpointed to)")


def _check_chaos_targets(args: argparse.Namespace, spec: JobSpec) -> None:
    from rlboost.local.chaos import parse_targets

    raw = getattr(args, "chaos_targets", "spot")
    try:
        targets = parse_targets(raw)
    except ValueError as err:
        raise JobSpecError(str(err)) from None
    if targets != ("spot",) and args.chaos_kill_every is None:
        raise JobSpecError("--chaos-targets: chaos needs a period; add --chaos-kill-every S")
    if getattr(args, "chaos_signal", "KILL") == "STOP" and targets != ("spot",):
        raise JobSpecError(
            "--chaos-signal STOP: only spot workers are frozen (the others are restarted); use --chaos-targets spot"
        )
    if "trainer" in targets and spec.trainer.ranks > 1:
        raise JobSpecError("--chaos-targets trainer: a killed trainer is restarted alone; use --trainer-ranks 1")


def _check_workers(args: argparse.Namespace, spec: JobSpec) -> None:
    """Some rollout worker can start (issue 31): reserved ones, spot ones at the start, or, replaying a trace, once
    its count rises above 0. Else the job would wait for its first step in silence."""
    from rlboost.local.plan import initial_spot_workers

    if spec.rollout.reserved.replicas > 0:
        return
    if args.spot_trace is not None:
        from rlboost.local.spot_trace import load_trace

        counts = load_trace(args.spot_trace).counts
        if spec.rollout.spot.max_replicas > 0 and max(counts, default=0) > 0:
            return
    elif initial_spot_workers(spec, None) > 0:
        return
    raise JobSpecError(
        "no rollout worker would start: rollout.reserved.replicas is 0 and no spot worker starts "
        f"(rollout.spot.replicas {spec.rollout.spot.replicas}, minReplicas {spec.rollout.spot.min_replicas}, "
        f"maxReplicas {spec.rollout.spot.max_replicas}"
        + (", and the trace's counts" if args.spot_trace is not None else "")
        + "); set rollout.reserved.replicas or rollout.spot.replicas >= 1"
    )


def run(args: argparse.Namespace) -> int:
    from rlboost.local.spot_trace import TraceError
    from rlboost.tracking import TrackingError, check_backends

    try:
        spec = resolve_spec(args)
        _check_inputs(args)
        check_backends(spec.logging)  # a missing library or a silent MLflow server: before any process starts
        _check_chaos_targets(args, spec)
        _check_workers(args, spec)
    except (JobSpecError, TraceError, TrackingError) as err:
        print(f"rlboost local: error: {err}", file=sys.stderr)
        return 2
    from rich.console import Console

    from rlboost.local.chaos import parse_targets
    from rlboost.local.plan import LocalOptions
    from rlboost.local.runner import run_local
    from rlboost.observability import dump_stacks_on_signals

    dump_stacks_on_signals()  # `kill -USR1/-USR2` this process: where a stuck run waits (tests do it on a deadline)
    run_dir = (args.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
    options = LocalOptions(
        run_dir=run_dir,
        dump_rollouts=args.dump_rollouts.resolve() if args.dump_rollouts else None,
        spot_trace=args.spot_trace,
        trace_time_scale=args.trace_time_scale,
        trace_step_seconds=args.trace_step_seconds,
        chaos_kill_every=args.chaos_kill_every,
        chaos_step_seconds=getattr(args, "chaos_step_seconds", None),
        chaos_signal=args.chaos_signal,
        chaos_targets=parse_targets(getattr(args, "chaos_targets", "spot")),
        seed=spec.algorithm.seed,
        checkpoint_dir=args.checkpoint_dir.resolve() if getattr(args, "checkpoint_dir", None) else None,
        resume=bool(getattr(args, "resume", False)),
    )
    report = args.json_report.resolve() if args.json_report else None
    return run_local(spec, options, Console(), report)
