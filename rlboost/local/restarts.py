"""Supervision of `rlboost local`'s services, as a kubelet restarts a pod's containers (issue 31 item 1).

Any child that dies while the job runs (the OOM killer's SIGKILL, a crash, an operator's kill) is started again
with its own command line, so on the same ports: the others reconnect to it (the trainer with --resume, from its
checkpoints). The delay before a restart is a bounded back-off: none after a child that had run `STABLE_AFTER_S`,
else `BACKOFF_BASE_S` doubling per consecutive death up to `BACKOFF_CAP_S`. A child that dies `CRASH_LOOP_LIMIT`
times in a row without a stable run is failing, not being killed: the run stops with its log's last lines rather
than restart it forever; the trainer's limit is the job's trainer.backoffLimit + 1, as on Kubernetes. Chaos kills
(`--chaos-kill-every`) are restarted at once and never count towards it.

Every restart is a `RestartRecord` (the live display counts them, the JSON report lists them); `back_after_seconds`
is filled once the restarted child answers its readiness probe again.

    restarts = Restarts(sup, started_at=time.monotonic(), start_child=..., ready=...)
    restarts.died(child, now)           # schedules it, or raises ChildFailedError (a crash loop)
    for name in restarts.due(now): restarts.start(name, now)
    restarts.poll(now)                  # readiness of the restarted ones
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from rlboost.local.report import RestartRecord
from rlboost.local.supervisor import Child, Supervisor

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 8.0
STABLE_AFTER_S = 60.0  # a child that ran this long starts its back-off afresh (a kubelet waits 10 min)
CRASH_LOOP_LIMIT = 6


def how_it_ended(returncode: int | None) -> str:
    """'SIGKILL', 'exit 1': how a child's process ended."""
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


@dataclass
class BackOff:
    """Consecutive deaths per child without a stable run, and the delay they earn (pure)."""

    deaths: dict[str, int] = field(default_factory=dict)

    def delay(self, name: str, uptime_s: float, limit: int = CRASH_LOOP_LIMIT) -> float | None:
        """Seconds to wait before starting `name` again after it died `uptime_s` after its start; None: give up
        (its `limit`-th death in a row)."""
        if uptime_s >= STABLE_AFTER_S:
            self.deaths[name] = 1
            return 0.0 if limit > 1 else None
        n = self.deaths[name] = self.deaths.get(name, 0) + 1
        if n >= limit:
            return None
        return min(BACKOFF_BASE_S * 2 ** (n - 1), BACKOFF_CAP_S)


@dataclass
class Restarts:
    """Children waiting to be started again, the restarts made, and which of them are back."""

    sup: Supervisor
    started_at: float
    start_child: Callable[[str], None]  # start `name` again from its plan (runner.start_child)
    ready: Callable[[str], bool]  # one readiness probe of `name`, never raising (Supervisor.probe_ready)
    limits: dict[str, int] = field(default_factory=dict)  # role -> deaths in a row that fail the run
    backoff: BackOff = field(default_factory=BackOff)
    records: list[RestartRecord] = field(default_factory=list)
    waiting: dict[str, tuple[float, RestartRecord]] = field(default_factory=dict)  # name -> (due at, its record)
    coming_back: dict[str, RestartRecord] = field(default_factory=dict)  # restarted, not ready yet
    on_restart: Callable[[RestartRecord], None] = lambda record: None  # the display's line

    def died(self, child: Child, now: float) -> None:
        """`child` exited without being asked to: schedule its restart, or raise ChildFailedError (a crash loop)."""
        uptime = now - child.started_at
        limit = self.limits.get(child.role, CRASH_LOOP_LIMIT)
        delay = self.backoff.delay(child.name, uptime, limit)
        ended = how_it_ended(child.proc.returncode)
        if delay is None:
            reason = f"keeps dying ({self.backoff.deaths[child.name]} times in a row, the last after {uptime:.0f}s)"
            raise self.sup.failure(child, reason)
        record = self._record(child, now, "died", ended, delay)
        self.waiting[child.name] = (now + delay, record)
        log.warning(
            "child died: restarting it",
            extra={"child": child.name, "ended": ended, "uptime_s": round(uptime, 1), "backoff_s": delay},
        )

    def replaced(self, child: Child, now: float) -> None:
        """A spot worker that died while the trace or chaos sizes the pool: a new worker replaces it (recorded)."""
        self._record(child, now, "replaced", how_it_ended(child.proc.returncode), 0.0)
        log.warning("spot worker died: a new one replaces it", extra={"child": child.name})

    def killed_by_chaos(self, child: Child, now: float) -> RestartRecord:
        """A chaos kill, restarted at once (no back-off, not a crash)."""
        return self._record(child, now, "chaos", how_it_ended(child.proc.returncode), 0.0)

    def _record(self, child: Child, now: float, cause: str, ended: str, delay: float) -> RestartRecord:
        record = RestartRecord(
            process=child.name,
            role=child.role,
            cause=cause,
            ended=ended,
            at_seconds=round(max(0.0, now - self.started_at), 3),
            uptime_seconds=round(max(0.0, now - child.started_at), 3),
            backoff_seconds=delay,
        )
        self.records.append(record)
        return record

    def due(self, now: float) -> list[str]:
        """Children whose back-off has passed, in the order they died."""
        return [name for name, (at, _) in self.waiting.items() if now >= at]

    def cancel(self, name: str) -> None:
        """Do not restart `name` after all (a trainer that announced the job's end before it exited): no record."""
        _, record = self.waiting.pop(name)
        self.records.remove(record)

    def start(self, name: str, now: float, record: RestartRecord | None = None) -> None:
        """Start `name` again (a due restart, or a chaos kill's `record`)."""
        if record is None:
            _, record = self.waiting.pop(name)
        self.start_child(name)
        record.restarted_at_seconds = round(max(0.0, now - self.started_at), 3)
        self.coming_back[name] = record
        self.on_restart(record)

    def poll(self, now: float) -> None:
        """Mark the restarted children that answer their readiness probe again (a dead one is `died` again)."""
        for name, record in list(self.coming_back.items()):
            if self.ready(name):
                record.back_after_seconds = round(max(0.0, now - self.started_at - record.at_seconds), 3)
                del self.coming_back[name]

    def back(self, name: str) -> bool:
        """`name` is neither waiting for its restart nor coming back from one."""
        return name not in self.waiting and name not in self.coming_back

    def back_all(self, names: list[str]) -> bool:
        return all(self.back(name) for name in names)

    @property
    def count(self) -> int:
        return len(self.records)
