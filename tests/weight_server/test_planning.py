"""The weight-server's planner on manifests alone (no disk, no HTTP): upload admission, retention, sync routes,
the cheapest plan and the runs a compacted delta composes."""

from __future__ import annotations

import pytest

from rlboost.wire.weights_io import Manifest
from weight_server.errors import ErrorKind, StoreError
from weight_server.planning import (
    Holdings,
    admit_upload,
    cheapest,
    check_install,
    compaction_run,
    retention,
    sync_routes,
)


def manifest(version: int, kind: str = "full", size: int = 100, base: int | None = None, **extra) -> Manifest:
    fmt = "safetensors" if kind == "full" else "rlboost-delta"
    return Manifest(
        version=version,
        kind=kind,  # type: ignore[arg-type]
        base_version=base,
        format=extra.pop("format", fmt),
        checksum=f"c{version}",
        total_bytes=size,
        sha256="0" * 64,
        chunk_bytes=4096,
        **extra,
    )


def held(*manifests: Manifest) -> Holdings:
    """Holdings from manifests in upload order: a version's second payload is its companion."""
    primaries: dict[int, Manifest] = {}
    companions: dict[int, Manifest] = {}
    for m in manifests:
        if m.version in primaries:
            companions[m.version] = m.model_copy(update={"companion": True})
        else:
            primaries[m.version] = m
    return Holdings(primaries, companions)


def chain_of(full_at: tuple[int, ...], n: int, full_size: int = 1000, delta_size: int = 10) -> Holdings:
    """Versions 0..n-1: a snapshot at each of `full_at`, otherwise the delta from the version before."""
    return held(
        *(manifest(v, "full", full_size) if v in full_at else manifest(v, "delta", delta_size, v - 1) for v in range(n))
    )


def refusal(call, *args) -> tuple[ErrorKind, str | None]:
    with pytest.raises(StoreError) as err:
        call(*args)
    return err.value.kind, err.value.field


def steps(plan: list[Manifest]) -> list[tuple[int, str]]:
    return [(m.version, m.kind) for m in plan]


# ---- uploads ---------------------------------------------------------------------------------------
def test_new_versions_are_newer_than_all_held_or_uploading_and_deltas_name_an_older_held_base() -> None:
    h = chain_of((0,), 3)
    admit = lambda v, kind, base=None, uploading=(): admit_upload(h, uploading, (), v, kind, f"c{v}", base)  # noqa: E731
    assert admit(3, "delta", 2) is False and admit(7, "full") is False
    assert refusal(admit, 2, "delta", 1) == (ErrorKind.CONFLICT, "version")  # held: versions are immutable
    assert refusal(admit, 3, "full", None, {3}) == (ErrorKind.CONFLICT, "version")  # being uploaded
    assert refusal(admit, 4, "full", None, {5}) == (ErrorKind.CONFLICT, "version")  # not newer than an upload
    assert refusal(admit, 3, "delta") == (ErrorKind.INVALID, "base_version")
    assert refusal(admit, 3, "delta", 9) == (ErrorKind.INVALID, "base_version")  # not held
    assert refusal(admit, 3, "full", 2) == (ErrorKind.INVALID, "base_version")  # a snapshot has no base
    assert refusal(admit, 3, "sparse") == (ErrorKind.INVALID, "kind")
    assert refusal(admit, -1, "full") == (ErrorKind.INVALID, "version")
    assert refusal(admit_upload, h, (), (), 3, "full", "", None) == (ErrorKind.INVALID, "checksum")


def test_a_second_payload_of_the_other_kind_and_the_same_state_is_a_companion() -> None:
    h = chain_of((0,), 3)
    assert admit_upload(h, (), (), 2, "full", "c2", None) is True
    assert refusal(admit_upload, h, (), (), 2, "full", "another", None) == (ErrorKind.CONFLICT, "checksum")
    assert refusal(admit_upload, h, (), {2}, 2, "full", "c2", None) == (ErrorKind.CONFLICT, "version")  # on its way
    both = held(*h.primaries.values(), manifest(2, "full"))
    assert refusal(admit_upload, both, (), (), 2, "full", "c2", None) == (ErrorKind.CONFLICT, "version")
    # A delta companion of a snapshot version: the same base rules as any delta.
    snap = chain_of((0, 2), 3)
    assert admit_upload(snap, (), (), 2, "delta", "c2", 1) is True
    for base in (None, 2, 5):
        assert refusal(admit_upload, snap, (), (), 2, "delta", "c2", base) == (ErrorKind.INVALID, "base_version")


def test_an_install_whose_base_or_version_went_meanwhile_is_refused() -> None:
    h = chain_of((0,), 2)
    check_install(h, manifest(2, "delta", base=1))
    assert refusal(check_install, h, manifest(2, "delta", base=7)) == (ErrorKind.CONFLICT, "base_version")
    assert refusal(check_install, h, manifest(5, "full", companion=True)) == (ErrorKind.NOT_FOUND, "version")


# ---- retention -------------------------------------------------------------------------------------
def test_retention_keeps_the_newest_and_the_chain_back_to_their_snapshot() -> None:
    h = chain_of((0,), 4)
    assert retention(h, [], 2).versions == []  # 2 and 3 chain back to 0
    h = chain_of((0, 4), 6)
    dropped = retention(h, [(0, 3), (1, 3), (4, 5)], 2)
    assert dropped.versions == [0, 1, 2, 3] and dropped.compacted == [(0, 3), (1, 3)]
    assert retention(h, [], 10).versions == []


def test_a_companion_snapshot_ends_its_versions_chain() -> None:
    h = held(*chain_of((0,), 5).primaries.values(), manifest(3, "full"))
    assert retention(h, [], 2).versions == [0, 1, 2]
    assert retention(chain_of((0,), 5), [], 2).versions == []


# ---- sync plans ------------------------------------------------------------------------------------
def test_routes_are_the_chain_from_the_worker_and_the_nearest_snapshot_with_its_deltas() -> None:
    h = held(
        manifest(0, "full", 1000),
        manifest(1, "delta", 10, 0),
        manifest(2, "delta", 10, 1),
        manifest(3, "full", 100),
        manifest(4, "delta", 10, 3),
        manifest(5, "delta", 200, 4),
    )
    plan = lambda a, b: steps(cheapest(sync_routes(h, a, b).candidates()))  # noqa: E731
    assert plan(0, 2) == [(1, "delta"), (2, "delta")]
    assert plan(None, 2) == [(0, "full"), (1, "delta"), (2, "delta")]
    assert plan(1, 4) == [(3, "full"), (4, "delta")]  # the chain from 1 is broken by the snapshot 3
    assert plan(4, 5) == [(5, "delta")]  # 200 B beats 100 + 10 + 200 B
    assert plan(2, 2) == [] and plan(None, None) == [(3, "full"), (4, "delta"), (5, "delta")]
    assert refusal(sync_routes, h, 3, 2) == (ErrorKind.INVALID, "from")
    assert refusal(sync_routes, h, None, 9) == (ErrorKind.NOT_FOUND, "to")
    assert refusal(sync_routes, Holdings({}), None, None) == (ErrorKind.NOT_FOUND, "to")


def test_a_snapshot_version_with_its_delta_serves_both_the_worker_one_behind_and_a_new_one() -> None:
    h = held(*chain_of((0,), 5, full_size=1000).primaries.values(), manifest(3, "full", 1000))
    plan = lambda a, b: steps(cheapest(sync_routes(h, a, b).candidates()))  # noqa: E731
    assert plan(2, 3) == [(3, "delta")]
    assert plan(None, 3) == [(3, "full")]
    assert plan(None, 4) == [(3, "full"), (4, "delta")]
    assert plan(1, 4) == [(2, "delta"), (3, "delta"), (4, "delta")]  # walks through the snapshot version


def test_a_chain_that_lost_its_base_cannot_be_rebuilt() -> None:
    h = held(manifest(3, "delta", base=2), manifest(4, "delta", base=3))  # 2 expired; a worker at 2 is still served
    assert steps(cheapest(sync_routes(h, 2, 4).candidates())) == [(3, "delta"), (4, "delta")]
    assert refusal(sync_routes, h, None, 4) == (ErrorKind.CONFLICT, "to")


def test_runs_of_two_or_more_deltas_may_be_compacted_and_the_fewest_bytes_win() -> None:
    h = chain_of((0,), 5)
    routes = sync_routes(h, 1, 4)
    assert [(steps(head), steps(run)) for head, run in routes.compactable()] == [
        ([], [(2, "delta"), (3, "delta"), (4, "delta")]),
        ([(0, "full")], [(1, "delta"), (2, "delta"), (3, "delta"), (4, "delta")]),
    ]
    # A chain of one delta is not compacted, nor is a snapshot followed by one delta.
    assert [len(run) for _, run in sync_routes(h, 3, 4).compactable()] == [4]  # only the snapshot's deltas
    assert sync_routes(h, None, 1).compactable() == []
    one = manifest(4, "delta", 15, 1, compacted=True)
    best = cheapest([*routes.candidates(), [one]])
    assert best == [one]  # 15 B beats the 30 B chain
    assert cheapest([[manifest(1, size=10)], [manifest(2, size=5), manifest(3, size=5)]])[0].version == 1  # tie: fewer


# ---- compaction ------------------------------------------------------------------------------------
def test_a_compaction_run_follows_stored_deltas_companions_included() -> None:
    h = held(*chain_of((0, 3), 5).primaries.values(), manifest(3, "delta", 10, 2))
    assert steps(compaction_run(h, 1, 4)) == [(2, "delta"), (3, "delta"), (4, "delta")]
    assert refusal(compaction_run, h, 9, 4) == (ErrorKind.NOT_FOUND, "base_version")  # base not held
    assert refusal(compaction_run, h, 0, 9) == (ErrorKind.NOT_FOUND, "base_version")
    assert refusal(compaction_run, h, 2, 2) == (ErrorKind.INVALID, "to")
    foreign = held(manifest(0), manifest(1, "delta", base=0, format="other"), manifest(2, "delta", base=1))
    assert refusal(compaction_run, foreign, 0, 2) == (ErrorKind.INVALID, "format")
