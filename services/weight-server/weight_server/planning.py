"""The weight-server's planning: which uploads fit, what retention drops, which payloads reach a version.

Pure, like rlboost/policies: no disk, no HTTP, no lock, no clock. Everything is a function of the
manifests the store holds, handed over as one `Holdings` snapshot; the store (store.py) keeps the
transactions (files, renames, fsyncs, its lock) and asks this module what to do. Refusals are
`StoreError`s of a domain kind (errors.py).

Companions: a version may hold two payloads, a full snapshot and the delta from an earlier version (the
trainer uploads both at each periodic snapshot version, delta first). The first upload of a version is its
primary payload; a second upload of the other kind with the same checksum is its companion. So a worker
one version behind a snapshot version pulls the small delta, and a new worker the snapshot.

Retention keeps the newest `retain_versions` versions plus every version that a retained delta chains back
to (its bases, down to the nearest version that holds a full snapshot, primary or companion), so every
retained version stays reachable from nothing. A version's payloads, companion included, go together, and
so does every compacted delta from or to it. A kept delta whose base has expired still serves a worker that
holds that base.

Sync plans: walking back from the target along delta bases gives the delta chain from the worker's version
(the worker holds that state, so the server need not) and the nearest full snapshot followed by its deltas.
A run of two or more deltas may instead be served as one compacted delta (composed by the store on first
request). Of the candidates, the fewest total bytes wins.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from rlboost.wire.weights_io import (
    HEADER_CHUNK_BYTES,
    HEADER_SIGNATURE,
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    SIGNATURE_PATTERN,
    Manifest,
)

from .errors import ErrorKind, StoreError

KINDS = ("full", "delta")
COMPOSABLE_FORMAT = "rlboost-delta"  # the delta format rlboost.delta.compose_chain composes


@dataclass(frozen=True, slots=True)
class Holdings:
    """The manifests held: each version's primary payload and, for some, a companion of the other kind."""

    primaries: Mapping[int, Manifest]
    companions: Mapping[int, Manifest] = field(default_factory=dict)

    def latest(self) -> int | None:
        return max(self.primaries, default=None)

    def payload(self, version: int, kind: str | None = None) -> Manifest:
        """The version's primary payload, or with `kind` its payload of that kind (primary or companion)."""
        found = self.primaries.get(version)
        if found is None:
            raise StoreError(ErrorKind.NOT_FOUND, f"version {version} is not held (see GET /v1/versions)", "version")
        if kind is None or found.kind == kind:
            return found
        check_kind(kind)
        companion = self.companions.get(version)
        if companion is None or companion.kind != kind:
            raise StoreError(
                ErrorKind.NOT_FOUND, f"version {version} holds no {kind} payload (it is a {found.kind})", "kind"
            )
        return companion

    def has_full(self, version: int) -> bool:
        companion = self.companions.get(version)
        return self.primaries[version].kind == "full" or (companion is not None and companion.kind == "full")

    def of_kind(self, kind: str) -> dict[int, Manifest]:
        """Every held payload of `kind` (primary or companion), by version."""
        return {m.version: m for m in (*self.primaries.values(), *self.companions.values()) if m.kind == kind}


# ---- uploads ---------------------------------------------------------------------------------------
def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise StoreError(ErrorKind.INVALID, f"kind must be 'full' or 'delta', got {kind!r}", "kind")


def admit_upload(
    held: Holdings,
    uploading: Collection[int],
    companions_uploading: Collection[int],
    version: int,
    kind: str,
    checksum: str,
    base_version: int | None,
) -> bool:
    """Whether an upload may start: True when it adds the other kind's payload to a held version (a companion),
    False when it is a new version; a StoreError naming the field at fault when it may not."""
    check_kind(kind)
    if not checksum:
        raise StoreError(ErrorKind.INVALID, "checksum of the whole parameter state is required", "checksum")
    if version < 0:
        raise StoreError(ErrorKind.INVALID, f"version must be >= 0, got {version}", "version")
    if kind == "full" and base_version is not None:
        raise StoreError(
            ErrorKind.INVALID, "base_version is only for deltas; leave it out for a full snapshot", "base_version"
        )
    primary = held.primaries.get(version)
    companion = primary is not None and primary.kind != kind  # a re-upload of the same kind is a new version: refused
    if companion:
        _check_companion(primary, version in held.companions or version in companions_uploading, checksum)
    else:
        _check_new_version(held, uploading, version)
    if kind == "delta":
        check_delta_base(held, version, base_version)
    return companion


def check_signed_layout(signature: str | None, chunk_bytes: int | None) -> None:
    """A trainer's signature is well-formed (base64 of 64 bytes; whether it verifies is for workers, which hold
    the key) and the chunk size it was computed with is within bounds."""
    if signature and not re.fullmatch(SIGNATURE_PATTERN, signature):
        raise StoreError(
            ErrorKind.INVALID, f"{HEADER_SIGNATURE} must be the base64 of a 64-byte Ed25519 signature", "signature"
        )
    if chunk_bytes is not None and not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise StoreError(
            ErrorKind.INVALID,
            f"{HEADER_CHUNK_BYTES} must be within {MIN_CHUNK_BYTES}..{MAX_CHUNK_BYTES}, got {chunk_bytes}",
            "chunk_bytes",
        )


def _check_companion(primary: Manifest, has_second: bool, checksum: str) -> None:
    """A second payload of a held version: it has none yet (nor one on its way) and produces the same state."""
    if has_second:
        raise StoreError(
            ErrorKind.CONFLICT, f"version {primary.version} already holds a full snapshot and a delta", "version"
        )
    if checksum != primary.checksum:
        raise StoreError(
            ErrorKind.CONFLICT,
            f"version {primary.version} is held with checksum {primary.checksum[:16]}; a second payload of it must "
            "produce the same state (same checksum)",
            "checksum",
        )


def _check_new_version(held: Holdings, uploading: Collection[int], version: int) -> None:
    """A new version: not held nor uploading, and newer than every version held or uploading."""
    if version in held.primaries or version in uploading:
        raise StoreError(ErrorKind.CONFLICT, f"version {version} already exists; versions are immutable", "version")
    newest = max([*held.primaries, *uploading], default=None)
    if newest is not None and version <= newest:
        raise StoreError(
            ErrorKind.CONFLICT, f"version {version} is not newer than the latest version {newest}", "version"
        )


def check_delta_base(held: Holdings, version: int, base_version: int | None) -> None:
    """A delta names its base, an older version the server holds."""
    if base_version is None:
        raise StoreError(
            ErrorKind.INVALID, "a delta needs its base version (header X-Rlboost-Base-Version)", "base_version"
        )
    if base_version not in held.primaries:
        raise StoreError(
            ErrorKind.INVALID,
            f"base_version {base_version} is not held; upload a full snapshot instead",
            "base_version",
        )
    if base_version >= version:
        raise StoreError(
            ErrorKind.INVALID, f"base_version {base_version} must be older than version {version}", "base_version"
        )


def check_install(held: Holdings, manifest: Manifest) -> None:
    """At commit: what the upload relies on is still held (retention may have dropped it meanwhile)."""
    if manifest.companion and manifest.version not in held.primaries:
        raise StoreError(
            ErrorKind.NOT_FOUND, f"version {manifest.version} was removed by retention during the upload", "version"
        )
    if manifest.kind == "delta" and manifest.base_version not in held.primaries:
        raise StoreError(
            ErrorKind.CONFLICT, f"base_version {manifest.base_version} was removed during the upload", "base_version"
        )


# ---- retention -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Retention:
    """What retention drops: versions (with all their payloads) and the compacted deltas from or to them."""

    versions: list[int]
    compacted: list[tuple[int, int]]


def retention(held: Holdings, compacted: Iterable[tuple[int, int]], retain_versions: int) -> Retention:
    """The versions outside the newest `retain_versions` that no retained delta chains back to, and the
    compacted (base, version) deltas that lose a version."""
    keep: set[int] = set()
    for v in sorted(held.primaries, reverse=True)[:retain_versions]:
        while v is not None and v not in keep and v in held.primaries:
            keep.add(v)
            v = None if held.has_full(v) else held.primaries[v].base_version
    return Retention(
        versions=sorted(set(held.primaries) - keep),
        compacted=[(a, b) for a, b in compacted if a not in keep or b not in keep],
    )


# ---- sync plans ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SyncRoutes:
    """The stored ways to a version: the delta chain from the worker's version, the nearest full snapshot +
    its deltas; None where there is none. Each is a list of manifests applied in order."""

    chain: list[Manifest] | None
    snapshot: list[Manifest] | None

    def candidates(self) -> list[list[Manifest]]:
        return [route for route in (self.chain, self.snapshot) if route is not None]

    def compactable(self) -> list[tuple[list[Manifest], list[Manifest]]]:
        """(head, run): runs of two or more deltas that one compacted delta, after `head`, may replace."""
        out = []
        if self.chain is not None and len(self.chain) >= 2:
            out.append(([], self.chain))
        if self.snapshot is not None and len(self.snapshot) >= 3:
            out.append((self.snapshot[:1], self.snapshot[1:]))
        return out


def sync_routes(held: Holdings, from_version: int | None, to_version: int | None) -> SyncRoutes:
    """The routes for a worker at `from_version` (None: it holds nothing) to `to_version` (None: the latest).

    A worker already there gets the empty chain. A snapshot version that also holds the delta from the
    version before does not end the walk, so a worker just behind it gets the delta.
    """
    if to_version is None:
        to_version = held.latest()
        if to_version is None:
            raise StoreError(ErrorKind.NOT_FOUND, "no version has been uploaded yet", "to")
    if to_version not in held.primaries:
        raise StoreError(ErrorKind.NOT_FOUND, f"version {to_version} is not held (see GET /v1/versions)", "to")
    if from_version is not None and from_version > to_version:
        raise StoreError(ErrorKind.INVALID, f"from ({from_version}) must not be newer than to ({to_version})", "from")
    if from_version == to_version:
        return SyncRoutes(chain=[], snapshot=None)
    routes = _walk_back(from_version, to_version, held.of_kind("full"), held.of_kind("delta"))
    if not routes.candidates():
        raise StoreError(
            ErrorKind.CONFLICT, f"version {to_version} cannot be rebuilt: its delta chain lost its base", "to"
        )
    return routes


def _walk_back(
    from_version: int | None, to_version: int, fulls: Mapping[int, Manifest], deltas: Mapping[int, Manifest]
) -> SyncRoutes:
    path: list[Manifest] = []  # deltas walked so far, newest first
    chain: list[Manifest] | None = None
    snapshot: list[Manifest] | None = None
    v = to_version
    while True:
        if v == from_version:
            chain = list(reversed(path))
        if snapshot is None and v in fulls:
            snapshot = [fulls[v], *reversed(path)]
        # Past the snapshot, walking on only helps to reach from_version (still older than v).
        if snapshot is not None and (chain is not None or from_version is None or from_version > v):
            break
        d = deltas.get(v)
        if d is None or d.base_version is None:
            break
        path.append(d)
        v = d.base_version
    return SyncRoutes(chain, snapshot)


def cheapest(candidates: Sequence[list[Manifest]]) -> list[Manifest]:
    """The candidate of fewest total bytes; of equal bytes, fewest payloads."""
    return min(candidates, key=lambda c: (sum(m.total_bytes for m in c), len(c)))


# ---- compaction ------------------------------------------------------------------------------------
def compaction_run(held: Holdings, base: int, version: int) -> list[Manifest]:
    """The stored deltas (primary or companion) that a compacted base->version delta composes, oldest first;
    a StoreError when there is no such run or the server cannot compose it."""
    if base not in held.primaries:  # a compacted delta lives only while both its versions do
        raise StoreError(ErrorKind.NOT_FOUND, f"version {base} is not held: no compacted delta from it", "base_version")
    deltas = held.of_kind("delta")
    run: list[Manifest] = []
    v = version
    while v != base:
        m = deltas.get(v)
        if m is None or m.base_version is None or m.base_version < base:
            raise StoreError(
                ErrorKind.NOT_FOUND, f"no chain of stored deltas leads from version {base} to {version}", "base_version"
            )
        run.append(m)
        v = m.base_version
    if not run:
        raise StoreError(
            ErrorKind.INVALID, f"a compacted delta needs two different versions, got {base} and {version}", "to"
        )
    if any(m.format != COMPOSABLE_FORMAT for m in run):
        raise StoreError(
            ErrorKind.INVALID, f"deltas {base}->{version} are not all in the {COMPOSABLE_FORMAT} format", "format"
        )
    return list(reversed(run))
