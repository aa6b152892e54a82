"""Authentic weights: the trainer signs each version's manifest with the job's Ed25519 key, workers verify it.

The trust chain (docs/architecture.md, "Authentic weights"):

1. The trainer computes, from the payload bytes it is about to upload, the manifest the weight-server will store
   (`describe_payload`: whole sha256 and one sha256 per `chunk_bytes` chunk) and signs its canonical encoding
   (`canonical_manifest`: version, kind, base version, format, state checksum, sizes and every chunk's sha256)
   with the job's private key (`manifest.key`, mounted only into the trainer). The upload carries the signature
   and the chunk size (`X-Rlboost-Signature`, `X-Rlboost-Chunk-Bytes`).
2. The weight-server chunks the payload the same way and stores the signature in the manifest. It holds no key:
   it can serve what the trainer signed, never sign anything itself.
3. A worker (`ManifestVerifier`, the job's public key `manifest.pub`) checks every manifest of a sync plan, and
   that the plan chains from what it holds to what it asked for, before it fetches a byte; every chunk it then
   fetches must match its signed sha256, so every payload byte it applies is one the trainer signed. The state
   checksum the worker compares at the end is a signed field too.

The model's assets (config, tokenizer, chat template: what a worker without a model directory builds its engine
from) are signed too: the trainer uploads, beside them, one more asset `ASSET_MANIFEST` holding every asset's
sha256 and a signature over them (`sign_assets`); a verifying worker reads it first and writes only assets it
names, each matching its signed sha256 (`check_assets`), whatever the weight-server's asset list says.

Compacted deltas are composed by the weight-server from the chain, so no trainer signature covers them (and the
state checksum, built on xxh3, is not collision-resistant, so matching it proves nothing against a forger): a
verifying worker asks for plans without them (`compact=0`) and refuses one that holds one anyway.

Refusals raise `WeightsRejectedError` with a `reason` (the label of the worker's
`rlboost_worker_weight_rejected_total`): `unsigned`, `bad_signature`, `plan` (a signed manifest, but not the
version or chain asked for), `payload` (bytes that never matched their signed sha256) or `asset` (a model asset
missing, or not the bytes the signed asset manifest names).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rlboost.wire.weights_io import SIGNATURE_PATTERN, ChunkInfo, Manifest

DOMAIN = b"rlboost weight manifest v1\n"  # a signature of this key over anything else never verifies as a manifest
HASH_THREADS = 4  # chunk hashes in parallel beside the whole-payload sha256 (hashlib releases the GIL)
REASONS = ("unsigned", "bad_signature", "plan", "payload", "asset")
ASSET_DOMAIN = b"rlboost model assets v1\n"  # an asset manifest's signature never verifies as a weight manifest's
ASSET_MANIFEST = "rlboost-assets.json"  # the signed asset manifest, itself stored as an asset


class WeightsRejectedError(Exception):
    """A manifest or payload the job's trainer did not sign; `reason` is one of REASONS."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason, self.message = reason, message


def canonical_manifest(m: Manifest) -> bytes:
    """The bytes a signature covers: every field that decides what a worker applies, in one fixed encoding.

    Left out: where the server keeps the payload (`compacted`, `companion`), when it arrived (`created_at`) and
    the signature itself; none of them changes a byte the worker applies."""
    doc = {
        "version": m.version,
        "kind": m.kind,
        "base_version": m.base_version,
        "format": m.format,
        "checksum": m.checksum,
        "total_bytes": m.total_bytes,
        "sha256": m.sha256,
        "chunk_bytes": m.chunk_bytes,
        "chunks": [[c.index, c.offset, c.length, c.sha256] for c in m.chunks],
    }
    return DOMAIN + json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _sha256(view: memoryview) -> str:
    return hashlib.sha256(view).hexdigest()


def describe_payload(
    payload: bytes | bytearray | memoryview,
    *,
    version: int,
    kind: str,
    base_version: int | None,
    fmt: str,
    checksum: str,
    chunk_bytes: int,
) -> Manifest:
    """The manifest the weight-server computes for these bytes when it chunks them at `chunk_bytes`."""
    view = memoryview(payload).cast("B")
    offsets = range(0, len(view), chunk_bytes)
    with ThreadPoolExecutor(HASH_THREADS + 1, thread_name_prefix="sign-sha256") as pool:
        whole = pool.submit(_sha256, view)
        parts = list(pool.map(lambda o: _sha256(view[o : o + chunk_bytes]), offsets))
    chunks = [
        ChunkInfo(index=i, offset=o, length=min(chunk_bytes, len(view) - o), sha256=h)
        for i, (o, h) in enumerate(zip(offsets, parts, strict=True))
    ]
    return Manifest(
        version=version,
        kind=kind,
        base_version=base_version,
        format=fmt,
        checksum=checksum,  # type: ignore[arg-type]
        total_bytes=len(view),
        sha256=whole.result(),
        chunk_bytes=chunk_bytes,
        chunks=chunks,
    )


def canonical_assets(sha256s: dict[str, str]) -> bytes:
    """The bytes an asset manifest's signature covers: every asset's name and sha256, in one fixed encoding."""
    return ASSET_DOMAIN + json.dumps(sha256s, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class ManifestSigner:
    """The trainer's side: signs manifests with the job's Ed25519 private key."""

    def __init__(self, private_key: Any, chunk_bytes: int) -> None:
        self.key, self.chunk_bytes = private_key, chunk_bytes

    @classmethod
    def from_credentials(cls, directory: str | Path, chunk_bytes: int) -> ManifestSigner:
        from rlboost.auth.credentials import JobCredentials

        return cls(JobCredentials(Path(directory)).signing_key(), chunk_bytes)

    def sign(self, m: Manifest) -> str:
        return base64.b64encode(self.key.sign(canonical_manifest(m))).decode()

    def sign_assets(self, assets: dict[str, bytes]) -> bytes:
        """The asset manifest (ASSET_MANIFEST's bytes) of these assets: their sha256s and the signature over them.
        The same assets always give the same bytes (Ed25519 is deterministic), so a resumed trainer's upload of
        it is accepted as the same asset."""
        sha256s = {name: hashlib.sha256(data).hexdigest() for name, data in assets.items()}
        signature = base64.b64encode(self.key.sign(canonical_assets(sha256s))).decode()
        return json.dumps({"assets": sha256s, "signature": signature}, sort_keys=True).encode()

    def sign_payload(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        version: int,
        kind: str,
        base_version: int | None,
        fmt: str,
        checksum: str,
    ) -> str:
        """Describe the payload as the weight-server will (blocking: hashes every byte) and sign that."""
        m = describe_payload(
            payload,
            version=version,
            kind=kind,
            base_version=base_version,
            fmt=fmt,
            checksum=checksum,
            chunk_bytes=self.chunk_bytes,
        )
        return self.sign(m)


class ManifestVerifier:
    """The worker's side: refuses any manifest, or sync plan, that the job's trainer did not sign."""

    def __init__(self, public_key: Any) -> None:
        self.key = public_key

    @classmethod
    def from_credentials(cls, directory: str | Path) -> ManifestVerifier:
        from rlboost.auth.credentials import JobCredentials

        return cls(JobCredentials(Path(directory)).verify_key())

    def check(self, m: Manifest, version: int | None = None) -> None:
        """Raise WeightsRejectedError unless `m` carries a valid signature (and is of `version`, when given)."""
        from cryptography.exceptions import InvalidSignature

        what = f"version {m.version} ({'compacted ' if m.compacted else ''}{m.kind} payload)"
        if not m.signature:
            why = "the weight-server composed it" if m.compacted else "no job credentials, or a forged manifest?"
            raise WeightsRejectedError("unsigned", f"{what}: its manifest carries no trainer signature ({why})")
        try:
            if not re.fullmatch(SIGNATURE_PATTERN, m.signature):
                raise ValueError("not base64 of 64 bytes")
            self.key.verify(base64.b64decode(m.signature, validate=True), canonical_manifest(m))
        except (InvalidSignature, ValueError, binascii.Error):
            raise WeightsRejectedError(
                "bad_signature",
                f"{what}: its signature does not verify with this job's key (manifest altered, or signed by "
                "another job)",
            ) from None
        if version is not None and m.version != version:
            raise WeightsRejectedError("plan", f"asked for version {version}, got a signed manifest of {m.version}")

    def check_assets(self, document: bytes | None) -> dict[str, str]:
        """The sha256 of every asset, by name, from an asset manifest (ASSET_MANIFEST's bytes; None: the server
        holds none); raises WeightsRejectedError unless the job's trainer signed it."""
        from cryptography.exceptions import InvalidSignature

        if document is None:
            raise WeightsRejectedError(
                "unsigned",
                f"the model's assets come without {ASSET_MANIFEST}, the trainer's "
                "signed list of them (no job credentials on the trainer, or a forged server?)",
            )
        try:
            doc = json.loads(document)
            sha256s, signature = doc["assets"], doc["signature"]
            if not (isinstance(sha256s, dict) and all(isinstance(v, str) for v in sha256s.values())):
                raise ValueError("assets: not a map of names to sha256s")
            if not (isinstance(signature, str) and re.fullmatch(SIGNATURE_PATTERN, signature)):
                raise ValueError("not base64 of 64 bytes")
            self.key.verify(base64.b64decode(signature, validate=True), canonical_assets(sha256s))
        except (InvalidSignature, ValueError, KeyError, TypeError, binascii.Error):
            raise WeightsRejectedError(
                "bad_signature",
                f"{ASSET_MANIFEST}: its signature does not verify with this job's key (altered, or another job's)",
            ) from None
        return sha256s

    def check_plan(self, plan: Sequence[Manifest], from_version: int | None, to_version: int | None) -> None:
        """Every manifest signed, and together a chain from `from_version` (None: nothing held) to `to_version`
        (None: any): each delta applies to the version the one before produced (a full snapshot may start older
        than the version held: the server's snapshot route)."""
        held = from_version
        for m in plan:
            self.check(m)
            base = None if m.kind == "full" else m.base_version
            if m.kind == "delta" and base != held:
                raise WeightsRejectedError(
                    "plan", f"the plan's delta to version {m.version} applies to {base}, but {held} is held there"
                )
            held = m.version
        if plan and to_version is not None and held != to_version:
            raise WeightsRejectedError("plan", f"asked for version {to_version}, the plan reaches {held}")
