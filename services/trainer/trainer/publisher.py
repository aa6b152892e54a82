"""Publish the trainer's weights: bf16 state, checksum, a sparse delta or a full snapshot, upload.

The weight-server announces each uploaded version on NATS itself, so nothing is announced here.
Version v's checksum is `state_checksum` of the bf16 state (canonical order), the state a worker must
reproduce bit for bit.

weightSync.mode `delta` (the default): version 0, every `full_every`-th version and any version with no
usable base are full safetensors snapshots; every other version is `rlboost.delta.encode(last published
bf16 state, new bf16 state)` (bit-exact, ~1-2 B per changed element). A delta that is nearly as large as
the state itself is sent as a snapshot instead, and a delta whose base the server no longer holds is
re-sent as a snapshot. Mode `full` uploads a snapshot per version. A delta certain to be too large is not even
encoded: after a delta too large to send (and before the first) the publisher first counts the changed elements
(`rlboost.delta.exceeds`: the tensors with over a quarter changed go whole), which costs about a quarter of a pass
over a dense update; the choice is the one encoding would make, byte for byte.

Versions held: the weight-server's version list is asked once (the first `skip_if_present` check, or
`held_versions()` at the start or on resume) and again only after an upload error; in between the publisher adds
the versions it uploads itself, so a step asks the server nothing before its upload.

At a periodic snapshot version (every `full_every`-th) the delta from the last published version is
encoded too (concurrently with the snapshot) and uploaded FIRST: the weight-server holds and announces the
version as soon as the small delta lands, so workers one version behind pull it instead of the snapshot;
the snapshot follows as the version's companion payload (same checksum), for new workers and to bound
the chain. A refused or oversized companion delta is simply skipped.

Signing (job credentials given: rlboost.weights.signing): each upload, companion included, carries the trainer's
Ed25519 signature of the manifest the weight-server will compute for it (the payload hashed at weightSync.chunkBytes,
in a thread, just before its upload), so workers refuse any byte the trainer did not produce.

Pipelining: the bf16 cast runs in a thread, then checksum and encode run concurrently in two threads;
version v+1 is encoded while version v's upload still streams (uploads stay in version order, since a
delta's base must be on the server first). With `overlap=True`, `publish` returns as soon as the version
is encoded and the upload continues in the background, so the next step's rollout request goes out
meanwhile (the manager only assigns it to workers that hold the version, which they pull once the
weight-server announces it); `flush()` waits for it and re-raises its error. The event loop never blocks.

Retries: every call to the weight-server (uploads, the versions list, model assets) is retried with bounded
back-off while the server is unreachable or answers 5xx (it restarts from its on-disk store); an upload whose
answer was lost but which the server committed meets "version already exists" on its retry, and counts as
done when the held version has our checksum.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import torch
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from rlboost.models.layout import asset_files
from rlboost.weights.checksum import state_checksum
from rlboost.weights.safetensors_io import state_to_bytes, to_publish_dtype
from rlboost.weights.signing import ASSET_MANIFEST, ManifestSigner
from trainer import metrics

log = logging.getLogger(__name__)

RETRY_FOR_S = 120.0  # the weight-server may be restarting: keep trying this long, then fail the step
RETRY_FIRST_S, RETRY_MAX_S = 0.2, 3.0

T = TypeVar("T")


def _unreachable(err: BaseException) -> bool:
    """A weight-server error worth retrying: no answer (status 0) or a 5xx, but a full disk (507: it said what to
    free, and retrying would only hide that)."""
    status = getattr(err, "status", None)
    return isinstance(status, int) and (status == 0 or (status >= 500 and status != INSUFFICIENT_STORAGE))


INSUFFICIENT_STORAGE = 507  # the weight-server's data directory is full


async def with_retries(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, again after 0.2 s doubling to 3 s while the weight-server is unreachable, for RETRY_FOR_S."""
    retrying = AsyncRetrying(
        retry=retry_if_exception(_unreachable),
        wait=wait_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
        stop=stop_after_delay(RETRY_FOR_S),
        before_sleep=lambda st: log.warning(
            "weight-server unreachable; trying again",
            extra={"call": what, "attempt": st.attempt_number, "error": str(st.outcome.exception())},
        ),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await call()
    raise AssertionError("unreachable")  # AsyncRetrying either returns or re-raises


# A delta above this fraction of the dense state's bytes is uploaded as a full snapshot instead:
# nearly the same bytes, and it restarts the chain so later syncs read less.
DELTA_MAX_FRACTION = 0.8


class WeightUploader(Protocol):
    """The part of `rlboost.weights.client.WeightClient` the publisher uses."""

    async def versions(self) -> Any: ...

    async def manifest(self, version: int, kind: str | None = None) -> Any: ...

    async def upload(
        self,
        version: int,
        payload: bytes,
        kind: str,
        checksum: str,
        base_version: int | None = None,
        fmt: str = ...,
        **signed: Any,
    ) -> Any: ...

    async def upload_asset(self, name: str, data: bytes) -> Any: ...


async def upload_model_assets(
    client: WeightUploader, model_dir: Path, signer: ManifestSigner | None = None
) -> list[str]:
    """Upload the model directory's assets (config, tokenizer, chat template: rlboost.models.layout) so a worker
    with no model directory builds its engine from the weight-server alone; before the first version, so a worker
    that sees a version finds them. The same bytes again (a resumed trainer) are accepted. With a `signer`, last
    the signed asset manifest (rlboost.weights.signing.ASSET_MANIFEST) that verifying workers check them with."""
    assets = {path.name: await asyncio.to_thread(path.read_bytes) for path in asset_files(model_dir)}
    if signer is not None:
        assets[ASSET_MANIFEST] = signer.sign_assets(assets)
    names = []
    for name, data in assets.items():
        await with_retries(f"asset {name}", lambda name=name, data=data: client.upload_asset(name, data))
        names.append(name)
    log.info("model assets uploaded", extra={"assets": names})
    return names


@dataclass
class Published:
    version: int
    checksum: str
    kind: str  # 'full' or 'delta'
    nbytes: int  # payload bytes of the version (sent, or being sent with overlap), companion delta included
    seconds: float  # cast + checksum + encode (+ upload unless overlapped)
    uploaded: bool  # False when the weight-server already held the version
    base_version: int | None = None  # for deltas
    encode_seconds: float = 0.0
    upload_seconds: float = 0.0  # 0 while an overlapped upload is still in flight
    companion_base: int | None = None  # a snapshot version's companion delta: its base (None: no companion)
    companion_nbytes: int = 0  # and its bytes


@dataclass
class _Encoded:
    bf16: dict[str, torch.Tensor]
    checksum: str
    kind: str
    payload: bytes
    base_version: int | None
    seconds: float
    companion: bytes | None = None  # at a snapshot version: the delta from `companion_base`, uploaded first
    companion_base: int | None = None


def publish_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The published copy of a state: floating tensors cast to bf16 (others kept), contiguous on CPU.

    Never aliases the caller's tensors: the copy is the base of the next delta, so it must not move
    when the trainer updates its parameters in place.
    """
    out: dict[str, torch.Tensor] = {}
    for name, t in to_publish_dtype(state).items():
        c = t.detach().cpu().contiguous()
        out[name] = c.clone() if c.numel() and c.data_ptr() == state[name].data_ptr() else c
    return out


def encode_full(state: Mapping[str, torch.Tensor]) -> bytes:
    return state_to_bytes(state)


def encode_delta(
    base: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], base_version: int, version: int
) -> bytes:
    import rlboost.delta as rd

    return rd.encode(base, new, base_version=base_version, version=version)


def delta_exceeds(base: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], nbytes: float) -> bool:
    """The delta from `base` to `new` is certainly larger than `nbytes` (a count of changed elements, no encode)."""
    import rlboost.delta as rd

    return rd.exceeds(base, new, nbytes)


def _dense_bytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class WeightPublisher:
    """Uploads versions through a WeightClient; remembers the last published bf16 state (the next delta's base)."""

    def __init__(
        self,
        client: WeightUploader,
        mode: Literal["delta", "full"] = "delta",
        full_every: int = 10,
        overlap: bool = False,
        signer: ManifestSigner | None = None,
    ) -> None:
        if mode not in ("delta", "full"):
            raise ValueError(f"weightSync.mode must be 'delta' or 'full', got {mode!r}")
        if full_every < 1:
            raise ValueError(f"weightSync.fullEvery must be >= 1, got {full_every}")
        self.client, self.mode, self.full_every, self.overlap = client, mode, full_every, overlap
        self.signer = signer  # None: unsigned uploads (no job credentials)
        self.last_state: dict[str, torch.Tensor] | None = None
        self.last: Published | None = None
        self._inflight: asyncio.Task[None] | None = None
        # Count changed elements before encoding a delta: first, and after a delta too large to send (a dense
        # update, e.g. a high learning rate, is then never encoded only to be dropped); not after a delta that
        # was sent, where the count would be an extra pass. `deltas_not_encoded` counts the skipped encodes.
        self._count_first = True
        self.deltas_not_encoded = 0
        # The versions the weight-server holds, as far as this publisher knows: its listing (asked at the start,
        # and again after an upload error) plus the versions uploaded since; None: ask it before the next check.
        self._held: set[int] | None = None

    @classmethod
    def from_spec(
        cls, client: WeightUploader, weight_sync: Any, overlap: bool = False, credentials_dir: Path | None = None
    ) -> WeightPublisher:
        """A publisher configured by a JobSpec's `weight_sync` (rlboost.spec.WeightSyncSpec); with the job's
        `credentials_dir` it signs every upload with the job's key."""
        signer = None
        if credentials_dir is not None:
            signer = ManifestSigner.from_credentials(credentials_dir, weight_sync.chunk_bytes)
        return cls(client, weight_sync.mode, weight_sync.full_every, overlap, signer)

    async def held_versions(self) -> list[int]:
        """The weight-server's versions, asked of it (and remembered for `publish(skip_if_present=True)`)."""
        metrics.VERSION_LISTINGS.inc()
        listing = await with_retries("versions", self.client.versions)
        versions = list(getattr(listing, "versions", listing) or [])
        self._held = set(versions)
        return versions

    async def _is_held(self, version: int) -> bool:
        """Whether the weight-server holds `version`, from what this publisher knows (asking only when it does
        not: before its first listing and after an upload error)."""
        if self._held is None:
            await self.held_versions()
        assert self._held is not None
        return version in self._held

    async def publish(
        self, version: int, state: Mapping[str, torch.Tensor], skip_if_present: bool = False
    ) -> Published:
        """Cast, checksum, encode and upload `version`; with skip_if_present an existing version is kept.

        Returns once uploaded, or with `overlap` once encoded (the upload then runs in the background).
        """
        start = time.monotonic()
        enc = await self._encode(version, state)  # overlaps the previous version's upload, if any
        await self.flush()  # uploads stay in order: a delta's base must be on the server first
        uploaded = not (skip_if_present and await self._is_held(version))
        side = len(enc.companion) if enc.companion is not None else 0
        pub = Published(
            version,
            enc.checksum,
            enc.kind,
            len(enc.payload) + side,
            0.0,
            uploaded,
            enc.base_version,
            enc.seconds,
            companion_base=enc.companion_base,
            companion_nbytes=side,
        )
        self.last_state, self.last = enc.bf16, pub  # the next version's delta base, even while this one uploads
        if not uploaded:
            log.info("weight-server already holds this version", extra={"weight_version": version})
        elif self.overlap:
            self._inflight = asyncio.create_task(self._upload(pub, enc))
        else:
            await self._upload(pub, enc)
        pub.seconds = time.monotonic() - start
        log.info(
            "weights encoded; upload in flight" if self._inflight else "weights published",
            extra={
                "weight_version": version,
                "checksum": enc.checksum[:16],
                "kind": pub.kind,
                "base_version": pub.base_version,
                "bytes": pub.nbytes,
                "uploaded": uploaded,
                "encode_seconds": round(enc.seconds, 4),
            },
        )
        return self.last

    async def flush(self) -> None:
        """Wait for an upload still in flight (overlap mode); re-raises its error."""
        task, self._inflight = self._inflight, None
        if task is not None:
            await task

    async def aclose(self) -> None:
        """Finish an upload in flight, or cancel it if this task is being cancelled."""
        task, self._inflight = self._inflight, None
        if task is not None and not task.done():
            try:
                await task
            except asyncio.CancelledError:
                task.cancel()
                raise

    async def __aenter__(self) -> WeightPublisher:
        return self

    async def __aexit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            await self.aclose()
        elif self._inflight is not None:
            self._inflight.cancel()
            with contextlib.suppress(BaseException):
                await self._inflight
            self._inflight = None

    # ---- encoding ----------------------------------------------------------------------------
    def _previous(self, version: int) -> int | None:
        """The last published version, when a delta against it can be made (delta mode, older)."""
        if self.mode != "delta" or self.last_state is None or self.last is None or self.last.version >= version:
            return None
        return self.last.version

    def _delta_base(self, version: int) -> int | None:
        """The version this one is a delta against, or None for a full snapshot."""
        return None if version % self.full_every == 0 else self._previous(version)

    def _companion_base(self, version: int) -> int | None:
        """At a periodic snapshot version: the base of the delta uploaded beside the snapshot."""
        return self._previous(version) if version % self.full_every == 0 else None

    async def _delta(self, bf16: dict[str, torch.Tensor], base: int, version: int) -> bytes | None:
        """The delta from the last published state to `bf16`, or None when it is larger than DELTA_MAX_FRACTION of
        the state (then a snapshot is sent). Where a count of changed elements already shows that, it is not
        encoded: the choice, and so every byte sent, is the same as encoding and measuring it."""
        assert self.last_state is not None
        limit = DELTA_MAX_FRACTION * _dense_bytes(bf16)
        if self._count_first and await asyncio.to_thread(delta_exceeds, self.last_state, bf16, limit):
            self.deltas_not_encoded += 1
            metrics.DELTA_CHOICES.labels(outcome="not_encoded").inc()
            return None
        payload = await asyncio.to_thread(encode_delta, self.last_state, bf16, base, version)
        self._count_first = len(payload) > limit
        metrics.DELTA_CHOICES.labels(outcome="too_large" if self._count_first else "sent").inc()
        return None if self._count_first else payload

    async def _encode_companion(self, bf16: dict[str, torch.Tensor], base: int, version: int) -> bytes | None:
        try:
            return await self._delta(bf16, base, version)
        except Exception as err:  # the snapshot alone still publishes the version
            log.warning(
                "no companion delta", extra={"weight_version": version, "error": f"{type(err).__name__}: {err}"}
            )
            return None

    async def _encode(self, version: int, state: Mapping[str, torch.Tensor]) -> _Encoded:
        t0 = time.monotonic()
        bf16 = await asyncio.to_thread(publish_state, state)
        base = self._delta_base(version)
        checksum_job = asyncio.to_thread(state_checksum, bf16)
        if base is None:
            side = self._companion_base(version)
            side_job = self._encode_companion(bf16, side, version) if side is not None else asyncio.sleep(0)
            checksum, payload, companion = await asyncio.gather(
                checksum_job, asyncio.to_thread(encode_full, bf16), side_job
            )
            side = side if companion is not None else None
            return _Encoded(bf16, checksum, "full", payload, None, time.monotonic() - t0, companion, side)
        checksum, payload = await asyncio.gather(checksum_job, self._delta(bf16, base, version), return_exceptions=True)
        if isinstance(checksum, BaseException):
            raise checksum
        if isinstance(payload, BaseException) or payload is None:
            why = f"{type(payload).__name__}: {payload}" if isinstance(payload, BaseException) else "delta too large"
            counted = {"deltas_not_encoded": self.deltas_not_encoded}  # too large by a count, never encoded
            log.info(
                "publishing a full snapshot instead of a delta",
                extra={"weight_version": version, "why": why, **counted},
            )
            payload = await asyncio.to_thread(encode_full, bf16)
            return _Encoded(bf16, checksum, "full", payload, None, time.monotonic() - t0)
        return _Encoded(bf16, checksum, "delta", payload, base, time.monotonic() - t0)

    # ---- upload ------------------------------------------------------------------------------
    async def _upload(self, pub: Published, enc: _Encoded) -> None:
        """Upload one encoded version, remembered as held; after an error the server is asked again."""
        try:
            await self._upload_version(pub, enc)
        except BaseException:
            self._held = None
            raise
        if self._held is not None:
            self._held.add(pub.version)

    async def _upload_version(self, pub: Published, enc: _Encoded) -> None:
        """Upload one encoded version; a delta whose base the server lost is re-sent as a snapshot."""
        t0 = time.monotonic()
        if enc.kind == "delta":
            try:
                await self._put(pub.version, enc.payload, "delta", enc.checksum, enc.base_version)
            except Exception as err:
                if getattr(err, "field", None) != "base_version":
                    raise
                # The server lost the base (restarted on an empty volume, retention): send a snapshot.
                log.warning("delta base refused; uploading a full snapshot", extra={"weight_version": pub.version})
                enc.payload, enc.kind, enc.base_version = await asyncio.to_thread(encode_full, enc.bf16), "full", None
                await self._upload_version(pub, enc)
                return
        else:
            if enc.companion is not None:
                await self._upload_companion(pub, enc)
            await self._put(pub.version, enc.payload, "full", enc.checksum, None)
        pub.kind, pub.base_version = enc.kind, enc.base_version
        pub.companion_base = enc.companion_base if enc.companion is not None else None
        pub.companion_nbytes = len(enc.companion) if enc.companion is not None else 0
        pub.nbytes = len(enc.payload) + pub.companion_nbytes
        pub.upload_seconds = time.monotonic() - t0
        log.info(
            "weights uploaded",
            extra={
                "weight_version": pub.version,
                "kind": enc.kind,
                "bytes": len(enc.payload),
                "upload_seconds": round(pub.upload_seconds, 4),
            },
        )

    async def _put(self, version: int, payload: bytes, kind: str, checksum: str, base_version: int | None) -> None:
        """Upload one payload, signed when the publisher has the job's key (hashing it off the event loop)."""
        fmt = "safetensors" if kind == "full" else "rlboost-delta"
        signed: dict[str, Any] = {}
        if self.signer is not None:
            signature = await asyncio.to_thread(
                self.signer.sign_payload,
                payload,
                version=version,
                kind=kind,
                base_version=base_version,
                fmt=fmt,
                checksum=checksum,
            )
            signed = {"signature": signature, "chunk_bytes": self.signer.chunk_bytes}
        attempts = 0

        async def upload() -> None:
            nonlocal attempts
            attempts += 1
            try:
                await self.client.upload(
                    version, payload, kind=kind, checksum=checksum, base_version=base_version, fmt=fmt, **signed
                )
            except Exception as err:
                if attempts > 1 and getattr(err, "status", None) == 409 and await self._holds(version, kind, checksum):
                    return  # an earlier attempt was committed; only its answer was lost
                raise

        await with_retries(f"upload of version {version}", upload)

    async def _holds(self, version: int, kind: str, checksum: str) -> bool:
        """The server holds `version` as `kind` with this checksum."""
        try:
            held = await self.client.manifest(version, kind)
        except Exception:  # noqa: BLE001 (not held, or not readable: the upload's own error is the one to show)
            return False
        return getattr(held, "checksum", None) == checksum

    async def _upload_companion(self, pub: Published, enc: _Encoded) -> None:
        """Upload a snapshot version's delta before its snapshot; a refused base just drops the companion."""
        assert enc.companion is not None
        try:
            await self._put(pub.version, enc.companion, "delta", enc.checksum, enc.companion_base)
        except Exception as err:
            if getattr(err, "field", None) != "base_version":
                raise
            log.warning(
                "companion delta's base refused; uploading the snapshot alone",
                extra={"weight_version": pub.version, "base_version": enc.companion_base},
            )
            enc.companion, enc.companion_base = None, None
