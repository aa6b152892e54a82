"""The trainer's side of colocation (`trainer.colocateReserved`): reserved rollout workers share its accelerators.

Per step s, once the step's whole rollout batch is in (colocation turns streamed training off: reserved
workers must not generate on the accelerator while it trains):

  1. release: publish ColocationCommand(s, "release") on `rlboost.<ns>.<job>.colocation` and wait, up to
     `timeout_s`, for a ColocationAck from each of the `rollout.reserved.replicas` workers on
     `...colocation-acks`; they stop taking work and free their engine memory;
  2. train, publish the new weights;
  3. resume: publish ColocationCommand(s, "resume", version) and wait (same deadline) for the acks; the
     workers take their memory back and sync to the new version before taking the next step's work.

Each command is re-published every second until every worker acked (NATS core is at-most-once, and a
reserved worker may subscribe only after the first step's rollout ran on spot workers); workers treat a
repeated command idempotently. A deadline that passes is logged as an error and counted (rlboost_trainer_colocation_timeouts_total), and
training goes on: a reserved worker that died does not stop the job (on a GPU the trainer may then run
short of memory, which the log line explains). A negative ack (the engine failed) is logged the same way.

With the job's credentials each ack must carry the MAC of the worker it names (rlboost.auth.colocation_acks:
a key only that reserved worker got from the manager, and the trainer derives from the job's colocation.key):
an ack without one, or with another worker's, is not counted, so a worker cannot ack in another's name and end
the wait early. Each refusal is counted in rlboost_trainer_colocation_acks_refused_total{reason} and logged
once per worker id and reason (the command is re-sent every second, and so would a forger's acks be).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlboost.auth.colocation_acks import AckVerifier
from rlboost.spec import JobSpec
from rlboost.wire.events import (
    COLOCATION,
    COLOCATION_ACKS,
    COLOCATION_RELEASE,
    COLOCATION_RESUME,
    ColocationAck,
    ColocationCommand,
    StepReport,
)
from trainer import metrics

log = logging.getLogger(__name__)

RESEND_S = 1.0  # a command not yet acked by every worker is published again this often
MAX_REFUSALS_LOGGED = 64  # (worker id, reason) pairs logged; more are only counted (ids are the sender's choice)


@dataclass
class PhaseResult:
    """One release or resume of one step: who acked, how long the trainer waited."""

    acked: int
    wait_seconds: float
    failed: list[str]  # worker ids whose ack was not ok


class Colocation:
    """Sends release / resume commands over NATS and waits for the colocated workers' acks."""

    def __init__(
        self, nc, namespace: str, job: str, workers: int, timeout_s: float, verifier: AckVerifier | None = None
    ) -> None:
        """`verifier`: checks each ack's MAC (the job's colocation.key); None = acks taken as given (no
        credentials dir: NATS is open to anyone then anyway)."""
        self.nc, self.workers, self.timeout_s, self.verifier = nc, workers, timeout_s, verifier
        self.commands = COLOCATION.subject(namespace, job)
        self.acks_subject = COLOCATION_ACKS.subject(namespace, job)
        self._acks: dict[tuple[int, str], dict[str, ColocationAck]] = {}
        self._changed = asyncio.Condition()
        self._sub = None
        self._refusals_logged: set[tuple[str, str]] = set()

    async def start(self) -> None:
        """Subscribe to the acks (before the first command, so none is missed)."""
        self._sub = await self.nc.subscribe(self.acks_subject, cb=self._on_ack)
        await self.nc.flush(timeout=10)

    async def _on_ack(self, msg) -> None:
        try:
            ack = COLOCATION_ACKS.decode(msg.data)
        except ValueError as err:
            log.warning("bad colocation ack ignored", extra={"error": str(err)[:200]})
            return
        if self.verifier is not None and (why := self.verifier.refusal(ack)) is not None:
            self._refuse(ack, why)
            return
        async with self._changed:
            self._acks.setdefault((ack.step, ack.action), {})[ack.worker_id] = ack
            self._changed.notify_all()

    def _refuse(self, ack: ColocationAck, why: str) -> None:
        metrics.COLOCATION_ACKS_REFUSED.labels(why).inc()
        key = (ack.worker_id, why)
        if key in self._refusals_logged or len(self._refusals_logged) >= MAX_REFUSALS_LOGGED:
            return
        self._refusals_logged.add(key)
        log.warning(
            "colocation ack refused: its MAC is not the named worker's (an ack in another worker's name, or from a "
            "worker the manager gave no key); not counted",
            extra={"worker_id": ack.worker_id[:200], "step": ack.step, "action": ack.action, "reason": why},
        )

    async def release(self, step: int, version: int) -> PhaseResult:
        return await self._phase(step, COLOCATION_RELEASE, version)

    async def resume(self, step: int, version: int) -> PhaseResult:
        return await self._phase(step, COLOCATION_RESUME, version)

    async def _phase(self, step: int, action: str, version: int) -> PhaseResult:
        t0 = time.monotonic()
        acks = await self._command_until_acked(ColocationCommand(step=step, action=action, weight_version=version))
        waited = time.monotonic() - t0
        failed = sorted(w for w, a in acks.items() if not a.ok)
        metrics.COLOCATION_WAIT_SECONDS.labels(action).observe(waited)
        metrics.COLOCATION_ACKS.labels(action).inc(len(acks))
        extra = {
            "step": step,
            "action": action,
            "acked": len(acks),
            "expected": self.workers,
            "wait_s": round(waited, 4),
            "bytes": sum(a.nbytes for a in acks.values()),
        }
        if len(acks) < self.workers:
            metrics.COLOCATION_TIMEOUTS.labels(action).inc()
            log.error(
                f"colocation {action}: {len(acks)} of {self.workers} reserved workers acked within "
                f"{self.timeout_s:.0f}s; training goes on (a missing worker may still hold accelerator memory)",
                extra=extra,
            )
        elif failed:
            log.error(f"colocation {action} failed on {', '.join(failed)}", extra={**extra, "failed": failed})
        else:
            log.info(f"colocation {action} acked", extra=extra)
        self._acks.pop((step, action), None)
        return PhaseResult(len(acks), waited, failed)

    async def _command_until_acked(self, cmd: ColocationCommand) -> dict[str, ColocationAck]:
        """Publish the command, and again every RESEND_S until every worker acked or the deadline passed.

        NATS core delivers at most once and only to current subscribers: a worker that subscribes late
        (still starting while spot workers ran the first step) or missed a message gets the next copy.
        Workers handle a repeated command idempotently (releasing a released engine is a no-op)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            await self.nc.publish(self.commands, COLOCATION.encode(cmd))
            await self.nc.flush(timeout=10)
            left = deadline - time.monotonic()
            acks, done = await self._wait(cmd.step, cmd.action, min(RESEND_S, max(left, 0.0)))
            if done or time.monotonic() >= deadline:
                return acks

    async def _wait(self, step: int, action: str, timeout_s: float) -> tuple[dict[str, ColocationAck], bool]:
        key = (step, action)

        def enough() -> bool:
            return len(self._acks.get(key, {})) >= self.workers

        async with self._changed:
            with contextlib.suppress(TimeoutError):  # a missing ack is reported by the caller
                await asyncio.wait_for(self._changed.wait_for(enough), timeout_s)
            return dict(self._acks.get(key, {})), enough()

    async def close(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None


class Colocated:
    """The step loop's view of colocation: release before training, resume after publishing; each a no-op (None)
    when the job is not colocated or has no reserved workers."""

    def __init__(self, spec: JobSpec, job: str, credentials_dir: Path | None, timeout_s: float) -> None:
        self.spec, self.job, self.timeout_s = spec, job, timeout_s
        self.verifier = ack_verifier(spec, job, credentials_dir)  # built now: a missing colocation.key fails the start
        self.colocation: Colocation | None = None  # set by start() when colocated

    async def start(self, nc: Any, namespace: str) -> None:
        workers = self.spec.rollout.reserved.replicas
        if not self.spec.trainer.colocate_reserved or nc is None or workers == 0:
            return
        self.colocation = Colocation(nc, namespace, self.job, workers, self.timeout_s, self.verifier)
        await self.colocation.start()
        log.info(
            "colocated with the reserved rollout workers: they release memory while the trainer trains",
            extra={"workers": workers, "stream_training": False, "timeout_s": self.timeout_s},
        )

    async def release(self, step: int, version: int) -> PhaseResult | None:
        """Before training: the colocated workers free their engine memory."""
        if self.colocation is None:
            return None
        result = await self.colocation.release(step, version)
        metrics.COLOCATION_RELEASE_WAIT.set(result.wait_seconds)
        return result

    async def resume(self, step: int, version: int) -> PhaseResult | None:
        """After publishing `version`: the colocated workers take their memory back and sync to it."""
        if self.colocation is None:
            return None
        return await self.colocation.resume(step, version)


def ack_verifier(spec: JobSpec, job: str, credentials_dir: Path | None) -> AckVerifier | None:
    """Checks each colocation ack is its worker's (the job's colocation.key); None without credentials or when not
    colocated."""
    if credentials_dir is None or not spec.trainer.colocate_reserved:
        return None
    from rlboost.auth.credentials import JobCredentials

    return AckVerifier(JobCredentials(credentials_dir).colocation_key(), job)


def with_colocation(record: StepReport, released: PhaseResult | None, resumed: PhaseResult | None) -> StepReport:
    """Fill the record's colocation fields from the step's release / resume results (None: not colocated)."""
    if released is not None:
        record.colocation_released, record.colocation_wait_seconds = released.acked, released.wait_seconds
    if resumed is not None:
        record.colocation_resumed = resumed.acked
    return record
