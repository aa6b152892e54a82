"""Pulling weight versions from the weight-server and verifying them bit for bit.

`WeightPuller.pull(version)` fetches a version's payload (rlboost.weights.client.WeightClient: HTTP Range,
several streams), decodes it into a state dict, and checks `state_checksum(state)` against the manifest;
on a mismatch it refetches the full snapshot once, then gives up with WeightsError. The weight-server's sync plan
(`GET /v1/sync?from=held&to=version`) says what to fetch: a full snapshot now; `_apply_delta` is the hook
for sparse deltas (another issue).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollout_worker import metrics

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """A version could not be pulled or verified; the message says which and why."""


@dataclass
class PulledWeights:
    version: int
    state: dict[str, torch.Tensor]  # exact tensors as published (bf16)
    checksum: str  # verified equal to the manifest's
    nbytes: int  # payload bytes transferred
    seconds: float


class WeightPuller:
    """Pulls versions through a WeightClient (async); `held` is the last verified state, the base for deltas."""

    def __init__(self, client: object) -> None:
        self.client = client
        self.held: PulledWeights | None = None

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

    async def pull(self, version: int) -> PulledWeights:
        """Fetch, decode and verify `version`; refetch the full snapshot once if the checksum differs."""
        start = time.monotonic()
        base = self.held.version if self.held is not None else None
        plan = await self.client.sync_plan(base, version)
        if not plan:
            raise WeightsError(f"weight version {version}: the weight-server offers no way to reach it from {base}")
        target = plan[-1]
        state, nbytes = await self._follow(plan)
        checksum = await asyncio.to_thread(_checksum, state)
        if checksum != target.checksum:
            metrics.CHECKSUM_MISMATCHES.inc()
            log.warning("checksum mismatch; refetching the full snapshot", extra={"weight_version": version})
            state, more = await self._follow(await self.client.sync_plan(None, version))
            nbytes += more
            checksum = await asyncio.to_thread(_checksum, state)
            if checksum != target.checksum:
                metrics.CHECKSUM_MISMATCHES.inc()
                raise WeightsError(
                    f"weight version {version}: checksum {checksum[:12]} != manifest {target.checksum[:12]} "
                    "after a full refetch"
                )
        pulled = PulledWeights(version, state, checksum, nbytes, time.monotonic() - start)
        metrics.PULL_SECONDS.observe(pulled.seconds)
        metrics.PULL_BYTES.inc(nbytes)
        self.held = pulled
        log.info(
            "pulled weights",
            extra={"weight_version": version, "bytes": nbytes, "seconds": round(pulled.seconds, 3), "steps": len(plan)},
        )
        return pulled

    async def _follow(self, plan: list) -> tuple[dict[str, torch.Tensor], int]:
        """Apply a sync plan (manifests in order: a full snapshot and/or deltas) to the state held."""
        state = self.held.state if self.held is not None else None
        nbytes = 0
        for m in plan:
            payload = await self.client.pull(m)
            nbytes += len(payload)
            if m.kind == "full":
                state = await asyncio.to_thread(_state_from_bytes, payload)
            elif state is None:
                raise WeightsError(f"weight version {m.version}: a delta from {m.base_version} but no state is held")
            else:
                state = await asyncio.to_thread(_apply_delta, state, payload)
        return state, nbytes


def _checksum(state: Mapping[str, torch.Tensor]) -> str:
    from rlboost.weights.checksum import state_checksum

    return state_checksum(state)


def _state_from_bytes(payload: bytes) -> dict[str, torch.Tensor]:
    from rlboost.weights.safetensors_io import state_from_bytes

    return state_from_bytes(payload)


def _apply_delta(base: Mapping[str, torch.Tensor], payload: bytes) -> dict[str, torch.Tensor]:
    """Hook for sparse bit-exact deltas (the delta issue): decode `payload` and apply it to a copy of `base`."""
    try:
        from rlboost.weights.delta import apply_delta  # lands with the delta codec
    except ImportError:
        raise WeightsError("this worker cannot apply weight deltas yet (rlboost.weights.delta is missing)") from None
    return apply_delta(base, payload)
