"""Publish the trainer's weights: bf16 snapshot, checksum, upload to the weight-server.

The weight-server announces each uploaded version on NATS itself, so nothing is announced here.
Version v's checksum is `state_checksum` of the bf16 state (canonical order), the state a worker must
reproduce bit for bit. CPU-heavy work (cast, checksum, serialisation) runs in a thread so the event loop
keeps serving the gRPC stream and NATS.

Full snapshots for every version for now; a sparse-delta path against `self.last_state` plugs into
`_encode` (the previous published bf16 state is kept for that reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from rlboost.weights.checksum import state_checksum
from rlboost.weights.safetensors_io import state_to_bytes, to_publish_dtype

log = logging.getLogger(__name__)


class WeightUploader(Protocol):
    """The part of `rlboost.weights.client.WeightClient` the publisher uses."""

    async def versions(self) -> Any: ...

    async def upload(
        self, version: int, payload: bytes, kind: str, checksum: str, base_version: int | None = None, fmt: str = ...
    ) -> Any: ...


@dataclass
class Published:
    version: int
    checksum: str
    kind: str
    nbytes: int
    seconds: float
    uploaded: bool  # False when the weight-server already held the version


def publish_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The published copy of a state: floating tensors cast to bf16 (others kept), contiguous on CPU."""
    return {k: v.detach().cpu().contiguous() for k, v in to_publish_dtype(state).items()}


def encode_full(state: Mapping[str, torch.Tensor]) -> bytes:
    return state_to_bytes(state)


def _prepare(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], str, bytes]:
    bf16 = publish_state(state)
    return bf16, state_checksum(bf16), encode_full(bf16)


class WeightPublisher:
    """Uploads versions through a WeightClient; remembers the last published bf16 state."""

    def __init__(self, client: WeightUploader) -> None:
        self.client = client
        self.last_state: dict[str, torch.Tensor] | None = None
        self.last: Published | None = None

    async def held_versions(self) -> list[int]:
        listing = await self.client.versions()
        versions = getattr(listing, "versions", listing)
        return list(versions or [])

    async def publish(
        self, version: int, state: Mapping[str, torch.Tensor], skip_if_present: bool = False
    ) -> Published:
        """Cast, checksum, serialise and upload `version`; with skip_if_present an existing version is kept."""
        start = time.monotonic()
        bf16, checksum, payload = await asyncio.to_thread(_prepare, state)
        uploaded = True
        if skip_if_present and version in await self.held_versions():
            uploaded = False
            log.info("weight-server already holds this version", extra={"weight_version": version})
        else:
            await self.client.upload(version, payload, kind="full", checksum=checksum, fmt="safetensors")
        self.last_state = bf16
        self.last = Published(version, checksum, "full", len(payload), time.monotonic() - start, uploaded)
        log.info(
            "weights published",
            extra={"weight_version": version, "checksum": checksum[:16], "bytes": len(payload), "uploaded": uploaded},
        )
        return self.last
