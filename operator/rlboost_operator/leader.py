"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection package does it.

Every replica is a candidate with its own identity (pod name + a random suffix). The Lease's spec is
the election record: holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions.

- A candidate takes the Lease when it is absent, released (no holder), or expired. Expiry is judged
  on the candidate's own monotonic clock: the record must stay unchanged for leaseDurationSeconds
  after this candidate first saw it, so clock skew between nodes does not matter.
- The leader renews every retry period; if no renewal succeeds within the renew deadline, or the
  Lease names another holder, leadership is lost and the process exits (the pod restarts and stands
  by again), as controller-runtime does.
- Writes are optimistic: the update carries the resourceVersion that was read, and a 409 Conflict
  (someone else wrote first) is simply another try at the next period.

The decisions are pure functions (`observe`, `decide`, `next_record`, `still_leading`), tested
without a cluster; `LeaderElector` is the small I/O loop around them, on the operator's own `Kube`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from rlboost_operator.kube import Kube, KubeError
from rlboost_operator.metrics import LEADER

log = logging.getLogger(__name__)

LEASE_API_VERSION = "coordination.k8s.io/v1"


class ElectionConfig(BaseModel):
    """Where the Lease lives, who this candidate is, and the election's timing."""

    lease_name: str = Field("rlboost-operator", min_length=1, description="Name of the Lease (one per operator).")
    lease_namespace: str = Field("default", min_length=1, description="Namespace of the Lease (the release's).")
    identity: str = Field(min_length=1, description="This candidate's holderIdentity; unique per process.")
    lease_duration_s: int = Field(
        15, ge=1, description="How long an unrenewed Lease keeps standbys waiting (leaseDurationSeconds)."
    )
    renew_deadline_s: float = Field(10.0, gt=0, description="How long the leader keeps retrying a failed renewal.")
    retry_period_s: float = Field(2.0, gt=0, description="Period of acquisition attempts and renewals.")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        # As client-go demands: a leader must notice its lost renewals before a standby may take over.
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s:
            raise ValueError(
                f"need lease duration ({self.lease_duration_s}) > renew deadline ({self.renew_deadline_s}) "
                f"> retry period ({self.retry_period_s})"
            )
        return self


def new_identity(pod_name: str | None = None) -> str:
    """The pod's name (POD_NAME, from the downward API) plus a random suffix: unique across restarts."""
    base = pod_name or os.environ.get("POD_NAME") or os.uname().nodename
    return f"{base}_{secrets.token_hex(4)}"


# --- The election record and the pure decisions ---------------------------------------------------


def micro_time(at: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaseRecord:
    """The election record: a Lease's spec."""

    holder: str
    lease_duration_s: int
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True)
class Observation:
    """The record last seen, and when (this process's monotonic clock) it was first seen as it is."""

    record: LeaseRecord
    since: float


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """A changed record restarts the expiry clock; an unchanged one keeps it running."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


class Decision(StrEnum):
    ACQUIRE = "acquire"  # absent, released or expired: take it
    RENEW = "renew"  # ours: extend it
    WAIT = "wait"  # another live holder: stand by


def decide(observed: Observation | None, identity: str, now: float) -> Decision:
    """What a candidate does with the Lease it just read (None: there is no Lease)."""
    if observed is None:
        return Decision.ACQUIRE
    record = observed.record
    if record.holder == identity:
        return Decision.RENEW
    if not record.holder:
        return Decision.ACQUIRE  # released by a leader that shut down cleanly
    if observed.since + record.lease_duration_s <= now:
        return Decision.ACQUIRE  # the holder stopped renewing for a whole lease duration
    return Decision.WAIT


def next_record(current: LeaseRecord | None, identity: str, lease_duration_s: int, wall_now: datetime) -> LeaseRecord:
    """The record to write when acquiring or renewing: a new holder counts one more transition."""
    now = micro_time(wall_now)
    if current is not None and current.holder == identity:
        return replace(current, lease_duration_s=lease_duration_s, renew_time=now)
    transitions = current.transitions + 1 if current is not None else 0
    return LeaseRecord(identity, lease_duration_s, acquire_time=now, renew_time=now, transitions=transitions)


def released(record: LeaseRecord, wall_now: datetime) -> LeaseRecord:
    """The record a leader leaves behind when it stops cleanly: no holder, so a standby takes over at once."""
    return replace(record, holder="", lease_duration_s=1, renew_time=micro_time(wall_now))


def still_leading(last_renewed: float, now: float, renew_deadline_s: float) -> bool:
    """Whether the leader may keep acting: it renewed within the renew deadline."""
    return now - last_renewed < renew_deadline_s


# --- The I/O loop ------------------------------------------------------------------------------


class LeadershipLostError(RuntimeError):
    """This replica no longer holds the Lease; it must stop acting at once."""


class LeaderElector:
    """Acquire, renew and release one Lease through the operator's Kube client."""

    def __init__(self, kube: Kube, config: ElectionConfig) -> None:
        self.kube = kube
        self.config = config
        self.observed: Observation | None = None
        self._resource_version: str | None = None
        self._logged_holder: str | None = None

    @property
    def _where(self) -> dict[str, str]:
        return {"lease": f"{self.config.lease_namespace}/{self.config.lease_name}", "identity": self.config.identity}

    @property
    def leading(self) -> bool:
        return self.observed is not None and self.observed.record.holder == self.config.identity

    def _lease(self, record: LeaseRecord) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.config.lease_name, "namespace": self.config.lease_namespace}
        if self._resource_version is not None:
            meta["resourceVersion"] = self._resource_version
        return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": meta, "spec": record.spec()}

    def _store(self, lease: dict[str, Any] | None, now: float) -> None:
        if lease is None:
            self.observed, self._resource_version = None, None
            return
        self._resource_version = (lease.get("metadata") or {}).get("resourceVersion")
        self.observed = observe(self.observed, LeaseRecord.from_lease(lease), now)

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, decide, write. True when this candidate holds the Lease after it."""
        cfg, loop = self.config, asyncio.get_running_loop()
        self._store(await self.kube.get("Lease", cfg.lease_namespace, cfg.lease_name), loop.time())
        decision = decide(self.observed, cfg.identity, loop.time())
        if decision is Decision.WAIT:
            return False
        current = self.observed.record if self.observed is not None else None
        record = next_record(current, cfg.identity, cfg.lease_duration_s, datetime.now(UTC))
        try:
            if self.observed is None:
                written = await self.kube.create(self._lease(record))
            else:
                written = await self.kube.replace(self._lease(record))
        except KubeError as err:
            if err.status != 409:
                raise
            return False  # another candidate wrote first (or created it); read again next period
        self._store(written, loop.time())
        if decision is Decision.ACQUIRE:
            log.info("leader election: acquired the lease", extra={**self._where, "transitions": record.transitions})
        return True

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease; try every retry period until then."""
        log.info("leader election: standing by for the lease", extra=self._where)
        while True:
            try:
                if await asyncio.wait_for(self.try_acquire_or_renew(), self.config.renew_deadline_s):
                    LEADER.set(1)
                    return
            except Exception as err:  # the API may be briefly unreachable; a standby just keeps trying
                log.warning(
                    "leader election: lease not readable or writable", extra={**self._where, "error": repr(err)}
                )
            else:
                self._log_holder()
            await asyncio.sleep(self.config.retry_period_s)

    def _log_holder(self) -> None:
        """One log line per holder a standby sees, not one per retry."""
        holder = self.observed.record.holder if self.observed is not None else None
        if holder and holder != self._logged_holder:
            self._logged_holder = holder
            log.info("leader election: the lease is held by another replica", extra={**self._where, "holder": holder})

    async def keep(self) -> None:
        """Renew every retry period; raise LeadershipLostError when the lease is lost. Never returns otherwise."""
        loop = asyncio.get_running_loop()
        last_renewed = loop.time()
        while True:
            await asyncio.sleep(self.config.retry_period_s)
            # A renewal that hangs must not outlive the deadline: past it a standby may already act.
            left = self.config.renew_deadline_s - (loop.time() - last_renewed)
            try:
                renewed = await asyncio.wait_for(self.try_acquire_or_renew(), max(left, 0.0))
            except Exception as err:
                renewed = False
                log.warning("leader election: renewal failed", extra={**self._where, "error": repr(err)})
            if renewed:
                last_renewed = loop.time()
            elif not self.leading and self.observed is not None:
                self._lost(f"the lease is now held by {self.observed.record.holder or 'nobody'}")
            elif not still_leading(last_renewed, loop.time(), self.config.renew_deadline_s):
                self._lost(f"no renewal succeeded for {self.config.renew_deadline_s} s")

    def _lost(self, why: str) -> None:
        LEADER.set(0)
        log.error("leader election: lost the lease", extra={**self._where, "reason": why})
        raise LeadershipLostError(why)

    async def release(self) -> None:
        """Hand the Lease over at a clean shutdown: clear the holder so a standby need not wait for expiry."""
        LEADER.set(0)
        cfg = self.config
        try:
            # Read it again: a renewal cancelled in flight may have moved the resourceVersion on.
            self._store(await self.kube.get("Lease", cfg.lease_namespace, cfg.lease_name), 0.0)
            if not self.leading or self.observed is None:
                return  # another replica holds it already: nothing of ours to release
            await self.kube.replace(self._lease(released(self.observed.record, datetime.now(UTC))))
            log.info("leader election: released the lease", extra=self._where)
        except Exception as err:  # the standby takes over at expiry instead
            log.warning("leader election: could not release the lease", extra={**self._where, "error": repr(err)})
