"""The live view of a local run (rich): step k/N, reward trend, tokens/s per pool, step time split, workers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from rlboost.wire.events import StepReport, ValidationReport
from rlboost.wire.rollout_io import ManagerStatus

_BARS = "▁▂▃▄▅▆▇█"
STARVED_AFTER_S = 30.0  # as the manager's own warning (rollout_manager.starved)


def sparkline(values: list[float], width: int = 30) -> str:
    """The last `width` values as block characters, scaled between their min and max."""
    vals = values[-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return "".join(_BARS[int((v - lo) / span * (len(_BARS) - 1)) if span else 0] for v in vals)


@dataclass
class PoolRate:
    """Tokens/s per pool from successive GetStatus snapshots (per-worker counters; dead workers drop out)."""

    last: dict[str, int] = field(default_factory=dict)
    last_t: float | None = None
    rates: dict[str, float] = field(default_factory=dict)

    def update(self, status: ManagerStatus, now: float) -> None:
        current = {w.worker_id: w.tokens_generated for w in status.workers}
        if self.last_t is not None and now > self.last_t:
            per_pool: dict[str, float] = {}
            for w in status.workers:
                delta = max(0, w.tokens_generated - self.last.get(w.worker_id, w.tokens_generated))
                per_pool[w.pool.value] = per_pool.get(w.pool.value, 0) + delta
            self.rates = {pool: n / (now - self.last_t) for pool, n in per_pool.items()}
        self.last, self.last_t = current, now


@dataclass
class ProgressState:
    total_steps: int
    started: float = field(default_factory=time.monotonic)
    steps: list[StepReport] = field(default_factory=list)
    status: ManagerStatus | None = None
    rates: PoolRate = field(default_factory=PoolRate)
    preemptions: int = 0
    restarts: int = 0  # children the runner started again (rlboost.local.restarts)
    phase: str = "starting"
    starved_since: float | None = None  # since when requests wait with no worker registered at all

    def on_status(self, status: ManagerStatus) -> None:
        now = time.monotonic()
        self.status = status
        self.rates.update(status, now)
        starved = status.pending > 0 and not status.workers
        self.starved_since = (self.starved_since or now) if starved else None

    def stalled(self, after_s: float = STARVED_AFTER_S) -> str:
        """Why the job makes no progress, once that lasted `after_s` ('' otherwise): said, not waited on."""
        if self.starved_since is None or time.monotonic() - self.starved_since < after_s:
            return ""
        pending = self.status.pending if self.status else 0
        return f"{pending} requests pending and no rollout worker registered with the manager (see logs/*.log)"


def _steps_table(state: ProgressState) -> Table:
    t = Table(title=None, expand=False, box=None, padding=(0, 2))
    t.add_column("step", justify="right")
    t.add_column("reward", justify="right")
    t.add_column("trend")
    t.add_column("tokens", justify="right")
    t.add_column("rollout s", justify="right")
    t.add_column("train s", justify="right")
    t.add_column("sync s", justify="right")
    t.add_column("version", justify="right")
    t.add_column("logp gap", justify="right")
    last = state.steps[-1] if state.steps else None
    trend = sparkline([s.reward_mean for s in state.steps])
    if last is None:
        t.add_row(f"0/{state.total_steps}", "-", "", "-", "-", "-", "-", "-", "-")
    else:
        t.add_row(
            f"{last.step}/{state.total_steps}",
            f"{last.reward_mean:.3f}",
            trend,
            str(last.tokens),
            f"{last.rollout_seconds:.2f}",
            f"{last.train_seconds:.2f}",
            f"{last.sync_seconds:.2f}",
            str(last.weight_version),
            logprob_gap(last),
        )
    return t


def logprob_gap(rec: StepReport) -> str:
    """The trainer/worker log-prob gap of a step: mean/max |delta log-prob| (StepReport.logprob_mismatch_*)."""
    return f"{rec.logprob_mismatch_mean:.1e}/{rec.logprob_mismatch_max:.1e}"


def _workers_table(state: ProgressState) -> Table:
    t = Table(box=None, padding=(0, 2))
    for col in ("pool", "ready", "tokens/s", "weight versions", "running"):
        t.add_column(col)
    workers = state.status.workers if state.status else []
    for pool in ("reserved", "spot"):
        ws = [w for w in workers if w.pool.value == pool]
        versions = ",".join(f"{w.worker_id}@{w.weight_version}" for w in sorted(ws, key=lambda w: w.worker_id))
        rate = state.rates.rates.get(pool, 0.0)
        t.add_row(pool, str(len(ws)), f"{rate:.1f}", versions or "-", str(sum(w.running for w in ws)))
    return t


def render(state: ProgressState) -> Group:
    """One frame of the live display."""
    elapsed = time.monotonic() - state.started
    s = state.status
    header = Text.assemble(
        ("rlboost local ", "bold"),
        (f"[{state.phase}] ", "cyan"),
        f"{elapsed:5.0f}s  ",
        f"pending {s.pending if s else 0}  running {s.running if s else 0}  ",
        f"migrations {s.migrations if s else 0}  preemptions {state.preemptions}  restarts {state.restarts}",
    )
    if stalled := state.stalled():
        header.append(f"\nwaiting: {stalled}", style="bold red")
    validated = [s.validation for s in state.steps if s.validation is not None]
    parts = [header, _steps_table(state)] + ([Text(validation_line(validated[-1]))] if validated else [])
    return Group(*parts, _workers_table(state))


def step_line(rec: StepReport, total: int) -> str:
    """A plain one-line summary of a step (for non-terminal output), and of its evaluation when it had one."""
    line = (
        f"step {rec.step}/{total}  reward {rec.reward_mean:.3f}  tokens {rec.tokens}  "
        f"rollout {rec.rollout_seconds:.2f}s  train {rec.train_seconds:.2f}s  sync {rec.sync_seconds:.2f}s  "
        f"version {rec.weight_version}  logp gap {logprob_gap(rec)}"
    )
    if rec.reward_failures:  # failed reward calls by kind: no real zeros (issue 31)
        line += "  reward failures " + ", ".join(f"{k} {n}" for k, n in sorted(rec.reward_failures.items()))
    return line if rec.validation is None else f"{line}\n{validation_line(rec.validation)}"


def validation_line(v: ValidationReport) -> str:
    """An evaluation in one line: validation at step s, mean reward, pass@1, pass@k, mean response length."""
    return (
        f"validation after step {v.step} (version {v.weight_version}, {v.prompts} prompts x {v.k}): "
        f"reward {v.reward_mean:.3f}  pass@1 {v.pass_at_1:.3f}  pass@{v.k} {v.pass_at_k:.3f}  "
        f"length {v.response_tokens_mean:.1f} tokens  {v.seconds:.2f}s"
    )


def summary_table(steps: list[StepReport]) -> Table:
    t = Table(title="rlboost local: summary")
    for col in ("step", "reward", "tokens", "rollout s", "train s", "sync s", "tok/s", "version", "logp gap"):
        t.add_column(col, justify="right")
    for r in steps:
        tps = r.tokens / r.rollout_seconds if r.rollout_seconds > 0 else 0.0
        t.add_row(
            str(r.step),
            f"{r.reward_mean:.3f}",
            str(r.tokens),
            f"{r.rollout_seconds:.2f}",
            f"{r.train_seconds:.2f}",
            f"{r.sync_seconds:.2f}",
            f"{tps:.0f}",
            str(r.weight_version),
            logprob_gap(r),
        )
    return t
