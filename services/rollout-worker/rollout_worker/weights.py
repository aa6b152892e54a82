"""Pulling weight versions from the weight-server and verifying them bit for bit.

`WeightPuller.pull(version)` asks the weight-server for a sync plan (`GET /v1/sync?from=held&to=version`:
the fewest bytes of the delta chain, a compacted delta, or a full snapshot + deltas), fetches each payload
(rlboost.weights.client.WeightClient: HTTP Range over several streams, resuming a dropped connection) while
the previous one is applied, and applies it:

- a full snapshot is decoded into a fresh state;
- a delta is applied in place to the state held (rlboost.delta.apply_: the whole delta is validated against
  the base, names, shapes, dtypes and per-tensor checksums, before the first write, and the targets are
  re-hashed after it, so a corrupt or wrong-base delta never leaves half-applied weights).

Then the whole-state checksum (rlboost.weights.checksum) must equal the manifest's. After a delta it comes from
the delta's table (`delta_state_checksum`: the verified apply already hashed every tensor, so the state is not
read again); after a full snapshot `state_checksum` hashes the tensors. On a DeltaError, a bad payload or a checksum
mismatch the puller refetches the full snapshot (+ deltas) once; if that fails too it raises WeightsError.
The state it returns may be updated in place by later pulls: engines copy it into their own parameters.

Authentic weights (a client with the job's public key: rlboost.weights.signing): the client checks every manifest
of the plan against the trainer's signature before a byte is fetched, and every chunk against its signed sha256. A
refusal (WeightsRejectedError) is logged, counted in rlboost_worker_weight_rejected_total{reason} and raised as a
WeightsError, with no fallback: the engine keeps the weights it has and the next announced version is tried. A
failure after a delta changed the held state in place drops that state (the next pull starts from a snapshot), so
nothing half-applied ever serves as a base.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlboost.weights.signing import WeightsRejectedError
from rollout_worker import metrics

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """A version could not be pulled or verified; the message says which and why."""


class _BadPayloadError(Exception):
    """A payload that would not decode or apply (DeltaError, malformed safetensors): worth a full refetch."""


@dataclass
class PulledWeights:
    version: int
    state: dict[str, torch.Tensor]  # exact tensors as published (bf16)
    checksum: str  # verified equal to the manifest's
    nbytes: int  # payload bytes transferred
    seconds: float
    paths: dict[str, int] = field(default_factory=dict)  # bytes pulled per sync path: full, delta, compacted
    fallback: bool = False  # the plan failed and the full snapshot was fetched instead


class WeightPuller:
    """Pulls versions through a WeightClient (async); `held` is the last verified state, the base for deltas."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.held: PulledWeights | None = None
        self._touched = False  # a delta of the pull in progress changed a state in place

    async def wait_latest(self, timeout_s: float) -> int:
        """The newest version on the weight-server, waiting up to `timeout_s` for the first upload."""
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while True:
            try:
                latest = (await self.client.versions()).latest
            except Exception as err:  # unreachable server: retry until the deadline, then one clear line
                if time.monotonic() >= deadline:
                    raise WeightsError(f"weight-server unreachable: {type(err).__name__}: {err}") from None
                latest = None
            if latest is not None:
                return latest
            if time.monotonic() >= deadline:
                raise WeightsError(f"weight-server has no weight version after {timeout_s:.0f}s")
            await asyncio.sleep(delay)  # polling an HTTP endpoint for the first upload, not test synchronisation
            delay = min(delay * 2, 1.0)

    async def pull_first(self, timeout_s: float) -> PulledWeights:
        """The newest version, for a worker that holds none yet: waits for the first upload, and rides out a
        weight-server that is unreachable or restarting meanwhile (it is a separate process that can be
        preempted like any other) until `timeout_s`; then, or on any other error, raises."""
        deadline = time.monotonic() + timeout_s
        async for attempt in transient_retries(deadline):
            with attempt:
                return await self.pull(await self.wait_latest(max(0.0, deadline - time.monotonic())))
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def pull(self, version: int) -> PulledWeights:
        """Fetch, apply and verify `version`; on a bad delta or checksum mismatch refetch the full snapshot once;
        a version the trainer did not sign is refused (WeightsError) with the held state untouched."""
        base = self.held.version if self.held is not None else None
        self._touched = False
        try:
            return await self._pull(version, base)
        except BaseException as err:
            if self._touched:  # a delta changed the held state before the failure: it is no version's state now
                self.held = None
            if isinstance(err, WeightsRejectedError):
                metrics.WEIGHT_REJECTED.labels(err.reason).inc()
                log.error(
                    "weight version refused: not signed by this job's trainer; keeping the current weights",
                    extra={"weight_version": version, "from_version": base, "reason": err.reason, "error": str(err)},
                )
                raise WeightsError(f"weight version {version} refused ({err.reason}): {err}") from None
            raise

    async def _pull(self, version: int, base: int | None) -> PulledWeights:
        start = time.monotonic()
        plan = await self.client.sync_plan(base, version)
        if not plan:
            if self.held is not None and base == version:
                return self.held
            raise WeightsError(f"weight version {version}: the weight-server offers no way to reach it from {base}")
        paths: dict[str, int] = {}
        fallback = False
        try:
            state, verified = await self._follow(plan, paths, self.held.state if self.held is not None else None)
            checksum = verified or await asyncio.to_thread(_checksum, state)
            if checksum != plan[-1].checksum:
                metrics.CHECKSUM_MISMATCHES.inc()
                raise _BadPayloadError(f"checksum {checksum[:12]} != manifest {plan[-1].checksum[:12]}")
        except _BadPayloadError as err:
            fallback = True
            metrics.FALLBACKS.inc()
            log.warning(
                "weight update failed verification; refetching the full snapshot",
                extra={"weight_version": version, "from_version": base, "error": str(err)},
            )
            self.held = None  # the held state may have been changed by a delta that applied before the failure
            state, checksum = await self._full(version, paths)
        nbytes = sum(paths.values())
        pulled = PulledWeights(version, state, checksum, nbytes, time.monotonic() - start, paths, fallback)
        self._record(pulled, plan)
        self.held = pulled
        return pulled

    async def _full(self, version: int, paths: dict[str, int]) -> tuple[dict[str, torch.Tensor], str]:
        """The snapshot path (no compaction), from nothing held; WeightsError when even that does not verify."""
        plan = await self.client.sync_plan(None, version, compact=False)
        try:
            state, verified = await self._follow(plan, paths, None)
        except _BadPayloadError as err:
            raise WeightsError(f"weight version {version}: the full snapshot does not apply either ({err})") from None
        checksum = verified or await asyncio.to_thread(_checksum, state)
        if checksum != plan[-1].checksum:
            metrics.CHECKSUM_MISMATCHES.inc()
            raise WeightsError(
                f"weight version {version}: checksum {checksum[:12]} != manifest {plan[-1].checksum[:12]} "
                "after a full refetch"
            )
        return state, checksum

    async def _follow(
        self, plan: list, paths: dict[str, int], state: dict[str, torch.Tensor] | None
    ) -> tuple[dict[str, torch.Tensor], str | None]:
        """Apply a sync plan (manifests in order: a full snapshot and/or deltas) to `state`; the next payload
        downloads while the current one is applied. Returns the state and, when the last step was a verified
        delta, the state checksum its table vouches for (None: compute it from the state)."""
        verified: str | None = None
        fetch = asyncio.ensure_future(self.client.pull(plan[0]))
        try:
            for i, m in enumerate(plan):
                payload = await fetch
                if i + 1 < len(plan):
                    fetch = asyncio.ensure_future(self.client.pull(plan[i + 1]))
                path = m.sync_path
                paths[path] = paths.get(path, 0) + len(payload)
                metrics.PULL_BYTES.labels(path).inc(len(payload))
                state, verified = await self._apply(m, state, payload)
        finally:
            if not fetch.done():
                fetch.cancel()
        assert state is not None
        return state, verified

    async def _apply(
        self, m: Any, state: dict[str, torch.Tensor] | None, payload: bytes
    ) -> tuple[dict[str, torch.Tensor], str | None]:
        t0 = time.monotonic()
        verified: str | None = None
        if m.kind == "full":
            try:
                out = await asyncio.to_thread(_state_from_bytes, payload)
            except ValueError as err:
                raise _BadPayloadError(f"version {m.version} snapshot: {err}") from None
        elif state is None:
            raise _BadPayloadError(f"version {m.version}: a delta from {m.base_version} but no state is held")
        else:
            self._touched = True
            verified = await asyncio.to_thread(_apply_delta, state, payload)
            out = state
        metrics.APPLY_SECONDS.labels(m.sync_path).observe(time.monotonic() - t0)
        return out, verified

    def _record(self, pulled: PulledWeights, plan: list) -> None:
        metrics.PULL_SECONDS.observe(pulled.seconds)
        metrics.PULLED_VERSION.set(pulled.version)
        for path in ("full", "delta", "compacted"):
            metrics.VERSION_BYTES.labels(path).set(pulled.paths.get(path, 0))
        log.info(
            "pulled weights",
            extra={
                "weight_version": pulled.version,
                "checksum": pulled.checksum,
                "bytes": pulled.nbytes,
                "paths": pulled.paths,
                "fallback": pulled.fallback,
                "seconds": round(pulled.seconds, 3),
                "steps": len(plan),
            },
        )


def _checksum(state: Mapping[str, torch.Tensor]) -> str:
    from rlboost.weights.checksum import state_checksum

    return state_checksum(state)


def _state_from_bytes(payload: bytes) -> dict[str, torch.Tensor]:
    from rlboost.weights.safetensors_io import state_from_bytes

    return state_from_bytes(payload)


def _apply_delta(state: Mapping[str, torch.Tensor], payload: bytes) -> str | None:
    """Apply a sparse bit-exact delta in place; validated before the first write, so a DeltaError leaves
    `state` exactly as it was. Returns the state checksum of the result from the delta's table (None when its
    hash block differs from the state checksum's): apply_ verified every tensor against its table entry."""
    import rlboost.delta as rd
    from rlboost.weights.checksum import delta_state_checksum

    try:
        delta = rd.apply_(state, payload, verify_target=True)  # the table-derived checksum relies on this check
    except rd.DeltaError as err:
        metrics.DELTA_REJECTED.inc()
        raise _BadPayloadError(f"delta refused: {err}") from None
    return delta_state_checksum(delta)


def transient(err: BaseException) -> bool:
    """A weight-server that did not answer, or answered 5xx: it may be restarting; worth asking again."""
    from rlboost.weights.client import WeightServerError

    return isinstance(err, WeightServerError) and (err.status == 0 or err.status >= 500)


def transient_retries(deadline: float):
    """Retries of transient weight-server errors with backoff (0.2 s doubling to 2 s) until `deadline`."""
    from tenacity import AsyncRetrying, retry_if_exception, stop_before_delay, wait_exponential

    def log_retry(state) -> None:
        log.warning(
            "weight-server unavailable; retrying",
            extra={"attempt": state.attempt_number, "error": str(state.outcome.exception())},
        )

    return AsyncRetrying(
        retry=retry_if_exception(transient),
        wait=wait_exponential(multiplier=0.2, max=2.0),
        stop=stop_before_delay(max(0.0, deadline - time.monotonic())),
        before_sleep=log_retry,
        reraise=True,
    )
