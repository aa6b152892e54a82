"""Domain types of the weight-server's HTTP API (JSON bodies), shared by server and clients.

Routes (all under the weight-server's base URL; spelled in rlboost.wire.weight_routes):
  GET  /v1/versions                     -> VersionList
  GET  /v1/versions/{v}/manifest        -> Manifest (?kind=full|delta: that kind's payload of the version)
  GET  /v1/versions/{v}/payload         -> bytes (HTTP Range supported; chunks per manifest)
  GET  /v1/versions/{v}/{kind}/payload  -> bytes of the version's `kind` payload (a version may hold both a full
                                           snapshot and the delta from the version before: see Manifest.companion)
  GET  /v1/sync?from=A&to=B             -> list[Manifest]: what a worker at A applies, in order, to reach B
  GET  /v1/compacted/{a}/{b}/manifest   -> Manifest of the a->b delta composed from the chain (built on request)
  GET  /v1/compacted/{a}/{b}/payload    -> its bytes (HTTP Range supported)
  PUT  /v1/versions/{v}                 <- payload bytes; headers below; needs `Authorization: Bearer <token>`.
                                           A second PUT of a held version in the other kind, with the same
                                           checksum, adds that payload beside the first (a companion).
                                           With X-Rlboost-Signature the manifest keeps the trainer's signature.
  GET  /v1/assets                       -> AssetList: the model's non-weight files (config.json, tokenizer, chat
                                           template...), with sizes and sha256s
  GET  /v1/assets/{name}                -> one asset's bytes (ETag: its sha256)
  PUT  /v1/assets/{name}                <- an asset's bytes; needs the bearer token. Immutable: the same bytes again
                                           are accepted, other bytes refused (409). The trainer uploads them before
                                           its first version, so a worker that sees a version finds them.
  GET  /healthz, GET /metrics
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from rlboost.wire import weight_routes as routes

# Upload headers (PUT /v1/versions/{v}).
HEADER_KIND = "X-Rlboost-Kind"  # "full" | "delta"
HEADER_BASE_VERSION = "X-Rlboost-Base-Version"  # for deltas
HEADER_CHECKSUM = "X-Rlboost-Checksum"  # checksum of the whole parameter state at this version
HEADER_FORMAT = "X-Rlboost-Format"  # "safetensors" | "rlboost-delta"
# Signed uploads (rlboost.weights.signing): the trainer's Ed25519 signature of the manifest it computed, and the
# chunk size it computed the manifest's chunks with (the server chunks the payload the same way).
HEADER_SIGNATURE = "X-Rlboost-Signature"  # base64 of the 64-byte signature
HEADER_CHUNK_BYTES = "X-Rlboost-Chunk-Bytes"
SIGNATURE_PATTERN = r"^[A-Za-z0-9+/]{86}==$"  # base64 of 64 bytes
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 4096, 1 << 30

# Model assets: bounds the weight-server enforces (the largest real tokenizer.json files are ~35 MB).
ASSET_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # a plain file name: no directory, no '..'
MAX_ASSET_BYTES = 64 << 20
MAX_ASSETS = 64
MAX_ASSETS_TOTAL_BYTES = 256 << 20


SHA256_HEX = r"^[0-9a-f]{64}$"
MAX_PAYLOAD_BYTES = 1 << 42  # 4 TiB: no model's state is larger; a manifest saying more is not believed


class ChunkInfo(BaseModel):
    index: int = Field(ge=0, description="Chunk number, from 0.")
    offset: int = Field(ge=0, le=MAX_PAYLOAD_BYTES, description="Byte offset in the payload.")
    length: int = Field(ge=0, le=MAX_PAYLOAD_BYTES, description="Byte length.")
    sha256: str = Field(pattern=SHA256_HEX, description="Hex SHA-256 of the chunk's bytes.")


class Manifest(BaseModel):
    version: int = Field(ge=0, description="Weight version this payload produces.")
    kind: Literal["full", "delta"] = Field(description="A full snapshot or a delta from base_version.")
    base_version: int | None = Field(None, ge=0, description="For deltas: the version it applies to.")
    format: str = Field("safetensors", description="'safetensors' (full) or 'rlboost-delta'.")
    checksum: str = Field(description="Checksum of the whole parameter state at `version` (rlboost.weights.checksum).")
    total_bytes: int = Field(ge=0, le=MAX_PAYLOAD_BYTES, description="Payload size.")
    sha256: str = Field(pattern=SHA256_HEX, description="Hex SHA-256 of the whole payload.")
    chunk_bytes: int = Field(ge=0, le=MAX_PAYLOAD_BYTES, description="Chunk size (the last chunk may be shorter).")
    chunks: list[ChunkInfo] = Field(default_factory=list, description="Chunks, in order.")
    created_at: float = Field(0.0, description="Unix time of the upload.")
    compacted: bool = Field(
        False,
        description="A delta base_version->version composed on the server from the chain; its payload is at "
        "/v1/compacted/{base_version}/{version}/payload instead of /v1/versions/{version}/payload.",
    )

    companion: bool = Field(
        False,
        description="The second payload of a version held in both kinds (e.g. the delta from the previous version "
        "stored beside a periodic full snapshot; same checksum); its payload is at "
        "/v1/versions/{version}/{kind}/payload.",
    )
    signature: str | None = Field(
        None,
        description="The trainer's Ed25519 signature (base64) of this manifest's canonical encoding "
        "(rlboost.weights.signing), stored and served as uploaded; null when unsigned (no job credentials, or a "
        "compacted delta, which the server composes and cannot sign). Not validated here: a worker refuses a "
        "malformed one as a bad signature.",
    )

    @model_validator(mode="after")
    def _chunks_inside(self) -> Manifest:
        """A chunk past the payload's end would make a client write outside the buffer it allocated."""
        for c in self.chunks:
            if c.offset + c.length > self.total_bytes:
                raise ValueError(
                    f"chunks[{c.index}]: bytes {c.offset}..{c.offset + c.length} lie past total_bytes {self.total_bytes}"
                )
        return self

    @property
    def payload_path(self) -> str:
        """The payload's route under API_PREFIX (rlboost.wire.weight_routes)."""
        if self.compacted:
            return routes.compacted_payload(self.base_version, self.version)
        return routes.payload(self.version, self.kind if self.companion else None)

    @property
    def sync_path(self) -> str:
        """How this payload moves a worker: 'full', 'delta' (a stored version) or 'compacted'."""
        return "compacted" if self.compacted else self.kind


class VersionList(BaseModel):
    latest: int | None = Field(None, description="Newest version, or null when none was uploaded.")
    versions: list[int] = Field(default_factory=list, description="Versions retained, ascending.")


class AssetInfo(BaseModel):
    name: str = Field(pattern=ASSET_NAME_PATTERN, description="File name in the model directory, e.g. 'config.json'.")
    size: int = Field(ge=0, le=MAX_ASSET_BYTES, description="Bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex SHA-256 of the bytes.")


class AssetList(BaseModel):
    assets: list[AssetInfo] = Field(default_factory=list, max_length=MAX_ASSETS, description="Assets held, by name.")
