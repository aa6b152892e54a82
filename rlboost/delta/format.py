"""The rlboost delta format: a fixed header, a JSON tensor table, then the tensors' payloads.

Torch-free (the weight-server reads and composes deltas without torch). Layout, little-endian:

    0   8s  magic b"RLBDELTA"
    8   u16 format version (FORMAT_VERSION)
    10  u16 flags (0; reserved)
    12  u32 table length in bytes
    16  i64 base_version (the version the delta applies to)
    24  i64 version (the version it produces)
    32  u64 payload length in bytes
    40  u32 hash block size in bytes (hash_block_bytes; a power of two, 4 KiB .. 1 GiB)
    44  u32 reserved (0)
    48  u64 xxh3-64 of bytes 0..48 followed by the table
    56  table: one zstd frame (declaring its size) of UTF-8 JSON {"tensors": [TensorEntry, ...]}
    56+table_len  payload region; entries point into it with (offset, length)

Each tensor is `unchanged` (no payload), `dense` (the new raw bytes) or `sparse`. A sparse tensor is
cut into segments, runs of whole hash blocks that tile it (`segments`: each names where it stops; the
first starts at 0, every other where the one before stops; every stop but the last is a multiple of
the block's element count). A segment's payload is the byte planes of the position gaps, positions
counted from the segment's start, then the byte planes of the zigzagged modular
difference `new_bits - old_bits` (integer arithmetic on raw bit patterns, wrapping at the dtype's
width, so it is exact for every value including NaN payloads, ±0, inf and subnormals); a segment
without changes has no streams. Each plane is one stream: a zstd frame declaring the plane's size, or,
when its length equals the segment's change count, the plane's raw bytes (the encoder stores a plane
raw whenever zstd would not make it smaller: a tiny tensor's planes, where a frame's header costs more
than it saves). The tensor's payload is its segments' payloads in order. Segments
decode independently, so apply decodes, writes and hashes each on its own (on any free core).
Every entry carries checksums of the base tensor, the target tensor and its own payload, all
computed by `tensor_checksum` with the header's block size: the xxh3-64 of the bytes when they fit
in one block, else the xxh3-64 of the little-endian u64 xxh3-64 digests of every block (the last
one may be short). Blocks let several threads hash one large tensor at once.

Format history: version 1 hashed every tensor as one xxh3-64 stream (one thread per tensor);
version 2 hashes block-wise and adds hash_block_bytes to the header; version 3 splits a sparse
tensor's streams at segment boundaries; version 4 (this one) zstd-compresses the table (a model's
many tensors made the JSON table ~2-5% of a step's delta) and stores incompressible planes raw.
Older deltas are rejected with an error saying to
re-encode them (deltas are short-lived: a weight-server keeps a few versions and re-encodes nothing,
so a mixed-version chain cannot arise in one job).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from typing import Literal, NamedTuple

import xxhash
import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAGIC = b"RLBDELTA"
FORMAT_VERSION = 4
HEADER = struct.Struct("<8sHHIqqQIIQ")
HEADER_SIZE = HEADER.size  # 56
_HEADER_PREFIX = 48  # bytes of the header covered by the checksum (all but the checksum itself)
DEFAULT_BLOCK_BYTES = 1 << 20  # hash block: small enough to split a tensor over threads, large enough to be cheap
MIN_BLOCK_BYTES, MAX_BLOCK_BYTES = 1 << 12, 1 << 30
MAX_TABLE_BYTES = 1 << 28  # decompressed table limit (~1M tensors): a forged size cannot exhaust memory
_TABLE_LEVEL = 3  # the table is small: a slower level costs nothing measurable

# Element size of every dtype the codec carries; the codec works on unsigned views of this width.
DTYPE_ITEMSIZE: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex32": 4,
    "complex64": 8,
}

Encoding = Literal["unchanged", "dense", "sparse"]


class DeltaError(ValueError):
    """A delta that cannot be encoded, read or applied; the message names the tensor or field and the cause."""


def checksum(data: object) -> int:
    """xxh3-64 of a bytes-like object (fast: ~memory bandwidth), as an int."""
    return xxhash.xxh3_64_intdigest(data)


def check_block_bytes(block_bytes: int) -> int:
    """`block_bytes` if it is a valid hash block size, else DeltaError naming the allowed range."""
    if not MIN_BLOCK_BYTES <= block_bytes <= MAX_BLOCK_BYTES or block_bytes & (block_bytes - 1):
        raise DeltaError(
            f"hash_block_bytes is {block_bytes}; it must be a power of two from {MIN_BLOCK_BYTES} to {MAX_BLOCK_BYTES}"
        )
    return block_bytes


def combine_digests(digests: Sequence[int], nbytes: int, block_bytes: int) -> int:
    """A tensor checksum from the xxh3-64 of each of its blocks (see tensor_checksum)."""
    if nbytes <= block_bytes:
        return digests[0] if digests else xxhash.xxh3_64_intdigest(b"")
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(digests)}Q", *digests))


def block_digests(data: object, block_bytes: int, first: int = 0, stop: int | None = None) -> list[int]:
    """xxh3-64 of blocks [first, stop) of a bytes-like object."""
    buf = memoryview(data).cast("B")
    end = -(-len(buf) // block_bytes) if stop is None else stop
    return [xxhash.xxh3_64_intdigest(buf[b * block_bytes : (b + 1) * block_bytes]) for b in range(first, end)]


def tensor_checksum(data: object, block_bytes: int = DEFAULT_BLOCK_BYTES) -> int:
    """The format's checksum of a tensor's (or payload's) bytes: plain xxh3-64 when they fit in one block, else
    the xxh3-64 of the concatenated little-endian u64 xxh3-64 digests of the blocks."""
    buf = memoryview(data).cast("B")
    return combine_digests(block_digests(buf, block_bytes), len(buf), block_bytes)


class SegmentEntry(BaseModel):
    """One segment of a sparse tensor: where it stops, its changes, and its streams' compressed lengths."""

    model_config = ConfigDict(extra="forbid", strict=True)

    stop: int = Field(ge=0, description="End element (exclusive); the segment starts where the previous one stops.")
    changed: int = Field(ge=0, description="Changed elements inside the segment.")
    gap_planes: int = Field(0, ge=0, le=8, description="How many of `streams` are gap planes (0 without changes).")
    streams: list[int] = Field(
        default_factory=list,
        description="Compressed lengths of the gap planes then the value planes (none if no change).",
    )

    @property
    def length(self) -> int:
        return sum(self.streams)


class Span(NamedTuple):
    """A segment of a sparse tensor located: elements [start, stop), payload bytes [offset, offset + length)
    relative to the tensor's payload."""

    start: int
    stop: int
    offset: int
    seg: SegmentEntry


class TensorEntry(BaseModel):
    """One tensor of a delta: what it is, how it is encoded, where its payload lies."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(description="Parameter name, as in the state dict.")
    dtype: str = Field(description="Element type name, e.g. 'bfloat16' (see DTYPE_ITEMSIZE).")
    shape: list[int] = Field(description="Tensor shape.")
    encoding: Encoding = Field(description="'unchanged', 'dense' (new raw bytes) or 'sparse'.")
    changed: int = Field(ge=0, description="Number of elements whose bit pattern changed.")
    base_xxh3: int = Field(ge=0, description="tensor_checksum of the base tensor's raw bytes.")
    target_xxh3: int = Field(ge=0, description="tensor_checksum of the target tensor's raw bytes.")
    offset: int = Field(ge=0, description="Payload offset, relative to the payload region.")
    length: int = Field(ge=0, description="Payload length in bytes.")
    payload_xxh3: int = Field(ge=0, description="tensor_checksum of the payload bytes.")
    segments: list[SegmentEntry] = Field(
        default_factory=list, description="Sparse only: the segments tiling the tensor, in order (see the module)."
    )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def spans(self) -> list[Span]:
        """The segments with their element ranges and payload offsets (relative to this tensor's payload)."""
        # Computed once and kept in the instance (parse checks them, apply plans its jobs from them); not a
        # functools.cached_property, whose lock measured ~1 us a call on a model's hundreds of calls per delta.
        # Keyed by the segments list itself: model_copy(update={"segments": ...}) copies the instance dict, cache too.
        segments, spans = self.__dict__.get("_spans", (None, []))
        if segments is not self.segments:
            segments, spans, start, offset = self.segments, [], 0, 0
            for seg in segments:
                spans.append(Span(start, seg.stop, offset, seg))
                start, offset = seg.stop, offset + seg.length
            self.__dict__["_spans"] = (segments, spans)
        return spans


class Header(BaseModel):
    """The parsed fixed header."""

    format_version: int = Field(description="Format version of the delta.")
    base_version: int = Field(description="Weight version the delta applies to.")
    version: int = Field(description="Weight version the delta produces.")
    table_len: int = Field(description="Length of the JSON tensor table.")
    payload_len: int = Field(description="Length of the payload region.")
    hash_block_bytes: int = Field(description="Block size of every tensor and payload checksum (tensor_checksum).")


class Delta(BaseModel):
    """A parsed delta: header, table, and the payload region (a memoryview into the original bytes)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    header: Header = Field(description="Fixed header.")
    tensors: list[TensorEntry] = Field(description="Tensor table, in encoding order.")
    payload: memoryview = Field(description="The payload region.")

    def payload_of(self, entry: TensorEntry) -> memoryview:
        return self.payload[entry.offset : entry.offset + entry.length]

    @property
    def block_bytes(self) -> int:
        return self.header.hash_block_bytes


def pack(
    base_version: int,
    version: int,
    entries: list[TensorEntry],
    payload_parts: list[bytes],
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> bytes:
    """Assemble a delta from its table and the payload parts (in the order of the entries' offsets); the entries'
    checksums must have been computed with `block_bytes`."""
    text = json.dumps({"tensors": [e.model_dump() for e in entries]}, separators=(",", ":")).encode()
    table = zstandard.ZstdCompressor(level=_TABLE_LEVEL).compress(text)
    payload_len = sum(len(p) for p in payload_parts)
    fields = (MAGIC, FORMAT_VERSION, 0, len(table), base_version, version, payload_len, block_bytes, 0, 0)
    prefix = HEADER.pack(*fields)[:_HEADER_PREFIX]
    digest = xxhash.xxh3_64_intdigest(prefix + table)
    head = prefix + struct.pack("<Q", digest)
    return b"".join([head, table, *payload_parts])


def parse(data: bytes | bytearray | memoryview) -> Delta:
    """Parse and validate the header and table (not the payloads). Raises DeltaError on any defect."""
    buf = memoryview(data).cast("B")
    _check_magic_and_version(buf)
    if len(buf) < HEADER_SIZE:
        raise DeltaError(f"delta is truncated: {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header")
    _, fmt, flags, table_len, base_version, version, payload_len, block, reserved, digest = HEADER.unpack_from(buf, 0)
    if flags != 0 or reserved != 0:
        raise DeltaError(f"unsupported delta flags {flags:#x} / reserved field {reserved:#x} (must be 0)")
    expected_len = HEADER_SIZE + table_len + payload_len
    if len(buf) != expected_len:
        kind = "truncated" if len(buf) < expected_len else "has trailing bytes"
        raise DeltaError(f"delta {kind}: {len(buf)} bytes, header says {expected_len}")
    table_bytes = buf[HEADER_SIZE : HEADER_SIZE + table_len]
    if xxhash.xxh3_64_intdigest(bytes(buf[:_HEADER_PREFIX]) + bytes(table_bytes)) != digest:
        raise DeltaError("delta header/table checksum mismatch: the delta is corrupted")
    check_block_bytes(block)
    tensors = _parse_table(_table_text(table_bytes), payload_len, block)
    header = Header(
        format_version=fmt,
        base_version=base_version,
        version=version,
        table_len=table_len,
        payload_len=payload_len,
        hash_block_bytes=block,
    )
    return Delta(header=header, tensors=tensors, payload=buf[HEADER_SIZE + table_len :])


_OLD_FORMATS = {1: "whole-tensor checksums", 2: "one stream group per sparse tensor", 3: "uncompressed table"}


def _table_text(table: memoryview) -> bytes:
    """The table's JSON from its zstd frame, which must declare a size within MAX_TABLE_BYTES."""
    try:
        size = zstandard.frame_content_size(table)
        if size < 0:
            raise DeltaError("delta tensor table's zstd frame does not declare its size (the encoder always does)")
        if size > MAX_TABLE_BYTES:
            raise DeltaError(f"delta tensor table declares {size} bytes; at most {MAX_TABLE_BYTES} are read")
        text = zstandard.ZstdDecompressor().decompress(table, max_output_size=size)
    except zstandard.ZstdError as e:
        raise DeltaError(f"delta tensor table is not a valid zstd frame ({e})") from None
    if len(text) != size:
        raise DeltaError(f"delta tensor table decompressed to {len(text)} bytes, its frame declares {size}")
    return text


def _check_magic_and_version(buf: memoryview) -> None:
    if len(buf) < 10:
        raise DeltaError(f"delta is truncated: {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, fmt = struct.unpack_from("<8sH", buf, 0)
    if magic != MAGIC:
        raise DeltaError(f"not an rlboost delta: magic is {bytes(magic)!r}, expected {MAGIC!r}")
    if fmt in _OLD_FORMATS:
        raise DeltaError(
            f"delta format version {fmt} ({_OLD_FORMATS[fmt]}) is no longer read; this rlboost reads version "
            f"{FORMAT_VERSION}: re-encode the delta (rlboost delta encode) with this rlboost"
        )
    if fmt != FORMAT_VERSION:
        raise DeltaError(f"unsupported delta format version {fmt}; this rlboost reads version {FORMAT_VERSION}")


class _Table(BaseModel):
    """The table's JSON document."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tensors: list[TensorEntry] = Field(description="Tensor table, in encoding order.")


def _parse_table(table: bytes, payload_len: int, block_bytes: int) -> list[TensorEntry]:
    try:  # one pass of pydantic-core over the JSON: ~2x faster than json.loads and an entry-by-entry validation
        entries = _Table.model_validate_json(table).tensors
    except ValidationError as e:  # malformed JSON is reported as a ValidationError too
        raise DeltaError(f"delta tensor table is malformed: {_short(e)}") from None
    seen: set[str] = set()
    for e in entries:
        _check_entry(e, payload_len, block_bytes)
        if e.name in seen:
            raise DeltaError(f"delta tensor table lists {e.name!r} twice")
        seen.add(e.name)
    return entries


def _check_entry(e: TensorEntry, payload_len: int, block_bytes: int) -> None:
    where = f"tensor {e.name!r}"
    if e.dtype not in DTYPE_ITEMSIZE:
        raise DeltaError(f"{where}: unsupported dtype {e.dtype!r}")
    if any(d < 0 for d in e.shape):
        raise DeltaError(f"{where}: negative dimension in shape {e.shape}")
    if e.offset + e.length > payload_len:
        raise DeltaError(f"{where}: payload [{e.offset}, {e.offset + e.length}) lies outside the payload region")
    if e.changed > e.numel:
        raise DeltaError(f"{where}: {e.changed} changed elements but only {e.numel} elements")
    if e.encoding == "unchanged" and (e.changed or e.length or e.base_xxh3 != e.target_xxh3):
        raise DeltaError(f"{where}: 'unchanged' entry with a payload or a change")
    if e.encoding == "dense" and e.length != e.nbytes:
        raise DeltaError(f"{where}: dense payload is {e.length} bytes, tensor is {e.nbytes}")
    if e.encoding != "sparse" and e.segments:
        raise DeltaError(f"{where}: {e.encoding!r} entry with segments (only sparse entries have them)")
    if e.encoding == "sparse":
        _check_segments(e, block_bytes)


def _check_segments(e: TensorEntry, block_bytes: int) -> None:
    """A sparse entry's segments tile the tensor on block boundaries and account for its changes and payload.
    (One loop over plain ints: it runs for every segment of every delta before the first write.)"""
    where, numel, segments = f"tensor {e.name!r}", e.numel, e.segments
    if e.changed == 0:
        raise DeltaError(f"{where}: sparse entry with no changed elements")
    if not segments or segments[-1].stop != numel:
        raise DeltaError(f"{where}: sparse segments must end at the tensor's {numel} elements")
    per, start, changed, length = max(1, block_bytes // e.itemsize), 0, 0, 0
    for i, s in enumerate(segments):
        stop, n, gap_planes, streams = s.stop, s.changed, s.gap_planes, s.streams
        if stop <= start or (stop != numel and stop % per):
            raise DeltaError(f"{where} segment {i}: stops at {stop}, not a block boundary after {start}")
        if n > stop - start:
            raise DeltaError(f"{where} segment {i}: {n} changed elements in {stop - start}")
        if len(streams) != (gap_planes + e.itemsize if n else 0) or (not 1 <= gap_planes <= 8 if n else gap_planes):
            raise DeltaError(f"{where} segment {i}: {len(streams)} streams and {gap_planes} gap planes")
        if streams and min(streams) < 0:
            raise DeltaError(f"{where} segment {i}: negative stream length")
        start, changed, length = stop, changed + n, length + sum(streams)
    if changed != e.changed:
        raise DeltaError(f"{where}: the segments' changed counts do not add up to {e.changed}")
    if length != e.length:
        raise DeltaError(f"{where}: sparse stream lengths do not add up to the payload length")


def _short(e: Exception) -> str:
    text = str(e).splitlines()
    return "; ".join(line.strip() for line in text[:3])[:300]


class TensorInfo(BaseModel):
    """What `inspect` reports for one tensor."""

    name: str = Field(description="Parameter name.")
    dtype: str = Field(description="Element type name.")
    shape: list[int] = Field(description="Tensor shape.")
    encoding: Encoding = Field(description="'unchanged', 'dense' or 'sparse'.")
    numel: int = Field(description="Number of elements.")
    changed: int = Field(description="Changed elements (an upper bound for dense entries of composed deltas).")
    changed_fraction: float = Field(description="changed / numel (0 for empty tensors).")
    bytes: int = Field(description="Payload bytes of this tensor in the delta.")
    bytes_per_changed: float | None = Field(description="Payload bytes per changed element; null when none changed.")


class DeltaInfo(BaseModel):
    """What `inspect` reports for a whole delta."""

    format_version: int = Field(description="Format version.")
    base_version: int = Field(description="Version the delta applies to.")
    version: int = Field(description="Version the delta produces.")
    total_bytes: int = Field(description="Size of the whole delta, header and table included.")
    numel: int = Field(description="Elements over all tensors.")
    changed: int = Field(description="Changed elements over all tensors.")
    changed_fraction: float = Field(description="changed / numel.")
    bytes_per_changed: float | None = Field(description="total_bytes / changed; null when nothing changed.")
    tensors: list[TensorInfo] = Field(description="Per tensor, in table order.")


def inspect(data: bytes | bytearray | memoryview) -> DeltaInfo:
    """Describe a delta (header and table are validated; payloads are not decoded)."""
    d = parse(data)
    tensors = [
        TensorInfo(
            name=e.name,
            dtype=e.dtype,
            shape=e.shape,
            encoding=e.encoding,
            numel=e.numel,
            changed=e.changed,
            changed_fraction=e.changed / e.numel if e.numel else 0.0,
            bytes=e.length,
            bytes_per_changed=e.length / e.changed if e.changed else None,
        )
        for e in d.tensors
    ]
    numel = sum(t.numel for t in tensors)
    changed = sum(t.changed for t in tensors)
    total = len(memoryview(data).cast("B"))
    h = d.header
    return DeltaInfo(
        format_version=h.format_version,
        base_version=h.base_version,
        version=h.version,
        total_bytes=total,
        numel=numel,
        changed=changed,
        changed_fraction=changed / numel if numel else 0.0,
        bytes_per_changed=total / changed if changed else None,
        tensors=tensors,
    )
