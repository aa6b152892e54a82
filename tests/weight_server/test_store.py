"""VersionStore on a real directory: version rules, atomic install, restart reload, retention and sync plans."""

from __future__ import annotations

import hashlib

import pytest

from weight_server.errors import ErrorKind, StoreError
from weight_server.store import VersionStore


def put(store: VersionStore, version: int, data: bytes, kind: str = "full", base: int | None = None):
    up = store.begin_upload(version, kind, checksum=f"c{version}", base_version=base)
    up.write(data)
    return up.commit()


def test_manifest_chunks_hash_every_byte(tmp_path) -> None:
    store = VersionStore(tmp_path, chunk_bytes=4096, retain_versions=5)
    data = bytes(range(256)) * 41  # 10496 bytes: two full chunks and a short one
    up = store.begin_upload(0, "full", checksum="abc")
    for i in range(0, len(data), 1000):  # writes that straddle chunk boundaries
        up.write(data[i : i + 1000])
    m = up.commit()
    assert (m.total_bytes, m.sha256, m.format) == (len(data), hashlib.sha256(data).hexdigest(), "safetensors")
    assert [(c.offset, c.length) for c in m.chunks] == [(0, 4096), (4096, 4096), (8192, 2304)]
    for c in m.chunks:
        assert c.sha256 == hashlib.sha256(data[c.offset : c.offset + c.length]).hexdigest()
    assert store.payload_path(0).read_bytes() == data


def test_version_rules(tmp_path) -> None:
    store = VersionStore(tmp_path, 4096, 5)
    with pytest.raises(StoreError) as err:
        store.begin_upload(1, "delta", "c", base_version=0)
    assert (err.value.kind, err.value.field) == (ErrorKind.INVALID, "base_version")
    put(store, 3, b"x")  # the first upload may start at any version
    for version, kind, base, refused, field in [
        (3, "full", None, ErrorKind.CONFLICT, "version"),
        (2, "full", None, ErrorKind.CONFLICT, "version"),
        (4, "delta", None, ErrorKind.INVALID, "base_version"),
        (4, "delta", 1, ErrorKind.INVALID, "base_version"),
        (4, "sparse", None, ErrorKind.INVALID, "kind"),
        (4, "full", 3, ErrorKind.INVALID, "base_version"),
    ]:
        with pytest.raises(StoreError) as err:
            store.begin_upload(version, kind, "c", base_version=base)
        assert (err.value.kind, err.value.field) == (refused, field), (version, kind, base)
    with pytest.raises(StoreError) as err:
        store.begin_upload(4, "full", "")
    assert err.value.field == "checksum"


def test_concurrent_upload_of_same_version_conflicts(tmp_path) -> None:
    store = VersionStore(tmp_path, 4096, 5)
    first = store.begin_upload(0, "full", "c")
    with pytest.raises(StoreError) as err:
        store.begin_upload(0, "full", "c")
    assert err.value.kind == ErrorKind.CONFLICT
    store.release(first)
    put(store, 0, b"ok")  # released: the version is free again
    assert store.versions() == [0]


def test_restart_reloads_versions_and_drops_partial_uploads(tmp_path) -> None:
    store = VersionStore(tmp_path, 4096, 5)
    m0 = put(store, 0, b"a" * 5000)
    m1 = put(store, 1, b"d1", "delta", 0)
    partial = store.begin_upload(2, "full", "c")
    partial.write(b"never committed")  # the process "dies" here: the file is left behind, uncommitted
    partial._file.close()
    reopened = VersionStore(tmp_path, 4096, 5)
    assert reopened.versions() == [0, 1]
    assert reopened.manifest(0) == m0 and reopened.manifest(1) == m1
    assert list((tmp_path / "incoming").iterdir()) == []
    assert reopened.payload_path(0).read_bytes() == b"a" * 5000


def test_retention_keeps_full_snapshot_that_retained_deltas_chain_to(tmp_path) -> None:
    store = VersionStore(tmp_path, 4096, retain_versions=2)
    put(store, 0, b"full0")
    for v in range(1, 4):
        put(store, v, b"d", "delta", v - 1)
    # newest two are 2 and 3; their chain needs 1 and 0
    assert store.versions() == [0, 1, 2, 3]
    put(store, 4, b"full4")
    put(store, 5, b"d5", "delta", 4)
    assert store.versions() == [4, 5]
    assert not (tmp_path / "versions" / "0").exists()


def test_sync_plan_prefers_fewer_bytes(tmp_path) -> None:
    store = VersionStore(tmp_path, 4096, 50)
    put(store, 0, b"F" * 1000)
    put(store, 1, b"d" * 10, "delta", 0)
    put(store, 2, b"d" * 10, "delta", 1)
    put(store, 3, b"F" * 100, "full")
    put(store, 4, b"d" * 10, "delta", 3)
    plan = lambda a, b: [m.version for m in store.sync_plan(a, b)]  # noqa: E731
    assert plan(0, 2) == [1, 2]  # the chain
    assert plan(None, 2) == [0, 1, 2]  # new worker: snapshot + deltas
    assert plan(1, 4) == [3, 4]  # the chain from 1 passes a full snapshot: snapshot path
    assert plan(2, 2) == []
    assert plan(None, None) == [3, 4]  # to = latest
    put(store, 5, b"d" * 200, "delta", 4)
    assert plan(4, 5) == [5]  # 200 B delta beats 100 B snapshot + 10 B + 200 B
    for a, b, refused, field in [(3, 2, ErrorKind.INVALID, "from"), (None, 9, ErrorKind.NOT_FOUND, "to")]:
        with pytest.raises(StoreError) as err:
            store.sync_plan(a, b)
        assert (err.value.kind, err.value.field) == (refused, field)


# ---- compacted deltas (real rlboost.delta payloads) -------------------------------------------------
def _put_chain(store: VersionStore, states, full_at=(0,)):
    from rlboost.weights.safetensors_io import state_to_bytes
    from tests.weight_server.states import checksum, delta

    for v, s in enumerate(states):
        up = store.begin_upload(
            v, "full" if v in full_at else "delta", checksum(s), base_version=None if v in full_at else v - 1
        )
        up.write(state_to_bytes(s) if v in full_at else delta(states, v - 1, v))
        up.commit()


def test_sync_plan_serves_a_compacted_delta_that_applies_bit_exactly(tmp_path) -> None:
    import rlboost.delta as rd
    from tests.weight_server.states import chain, checksum

    states = chain(6)
    store = VersionStore(tmp_path, 4096, 50)
    _put_chain(store, states)
    plan = store.sync_plan(1, 5)
    chain_bytes = sum(store.manifest(v).total_bytes for v in range(2, 6))
    assert [(m.base_version, m.version, m.compacted, m.sync_path) for m in plan] == [(1, 5, True, "compacted")]
    assert plan[0].total_bytes < chain_bytes and plan[0].checksum == checksum(states[5])
    out = rd.apply(states[1], (tmp_path / "compacted" / "1-5" / "payload").read_bytes())
    assert checksum(out) == checksum(states[5])
    # A new worker: the snapshot followed by one compacted delta, not the snapshot and five deltas.
    assert [(m.kind, m.version, m.compacted) for m in store.sync_plan(None, 5)] == [
        ("full", 0, False),
        ("delta", 5, True),
    ]
    assert [m.version for m in store.sync_plan(1, 5, compact=False)] == [2, 3, 4, 5]
    assert [m.compacted for m in store.sync_plan(4, 5)] == [False]  # one delta: nothing to compact
    # Cached on disk: a restarted store serves the same manifest without composing again.
    again = VersionStore(tmp_path, 4096, 50)
    assert again.compacted_count() == 2 and again.compacted(1, 5) == plan[0]


def test_compacted_requests_that_make_no_chain_are_refused(tmp_path) -> None:
    from tests.weight_server.states import chain

    store = VersionStore(tmp_path, 4096, 50)
    _put_chain(store, chain(5), full_at=(0, 3))
    for a, b, refused in [(1, 4, ErrorKind.NOT_FOUND), (2, 2, ErrorKind.INVALID), (0, 9, ErrorKind.NOT_FOUND)]:
        with pytest.raises(StoreError) as err:
            store.compacted(a, b)
        assert err.value.kind == refused, (a, b)
    assert [m.version for m in store.sync_plan(1, 4)] == [3, 4]  # crosses the snapshot: snapshot path


def test_retention_drops_compacted_deltas_with_their_versions_and_keeps_chains_valid(tmp_path) -> None:
    from tests.weight_server.states import chain

    states = chain(10)
    store = VersionStore(tmp_path, 4096, retain_versions=2)
    _put_chain(store, states[:5], full_at=(0, 4))
    assert store.versions() == [0, 1, 2, 3, 4]  # 3 is among the newest two and chains back to 0
    _put_chain_from(store, states, 5, 7)
    assert store.versions() == [4, 5, 6]  # newest two and the snapshot they chain to
    assert store.compacted(4, 6).base_version == 4 and store.compacted_count() == 1
    assert [m.version for m in store.sync_plan(None, 6)] == [4, 6]  # snapshot + compacted 4->6
    _put_chain_from(store, states, 7, 10, full_at=(7,))
    assert store.versions() == [7, 8, 9]
    assert store.compacted_count() == 0 and not any((tmp_path / "compacted").iterdir())
    assert [m.version for m in store.sync_plan(None, 9)] == [7, 9]  # still reachable, from the new snapshot


def _put_chain_from(store: VersionStore, states, start: int, stop: int, full_at=()) -> None:
    from rlboost.weights.safetensors_io import state_to_bytes
    from tests.weight_server.states import checksum, delta

    for v in range(start, stop):
        full = v in full_at
        up = store.begin_upload(v, "full" if full else "delta", checksum(states[v]), None if full else v - 1)
        up.write(state_to_bytes(states[v]) if full else delta(states, v - 1, v))
        up.commit()


# ---- companions: a snapshot version that also holds the delta from the version before ------------------
def _put_version(store: VersionStore, states, v: int, kind: str):
    """Upload version v of `states` as a full snapshot or as the delta from v-1 (real payloads)."""
    from rlboost.weights.safetensors_io import state_to_bytes
    from tests.weight_server.states import checksum, delta

    base = v - 1 if kind == "delta" else None
    up = store.begin_upload(v, kind, checksum(states[v]), base_version=base)
    up.write(state_to_bytes(states[v]) if kind == "full" else delta(states, v - 1, v))
    return up.commit()


def _snapshot_chain(store: VersionStore, states, full_every: int = 3) -> None:
    """What the trainer uploads: v0 full; deltas; at each K-th version the delta first, then the snapshot."""
    _put_version(store, states, 0, "full")
    for v in range(1, len(states)):
        _put_version(store, states, v, "delta")
        if v % full_every == 0:
            _put_version(store, states, v, "full")


def test_snapshot_version_serves_its_delta_to_a_worker_one_behind_and_the_snapshot_to_a_new_one(tmp_path) -> None:
    import rlboost.delta as rd
    from rlboost.weights.safetensors_io import state_from_bytes
    from tests.weight_server.states import chain, checksum

    states = chain(5)
    store = VersionStore(tmp_path, 4096, 50)
    _snapshot_chain(store, states)
    full3, delta3 = store.manifest(3, "full"), store.manifest(3, "delta")
    assert (full3.companion, delta3.companion, delta3.base_version) == (True, False, 2)
    assert full3.checksum == delta3.checksum == checksum(states[3])
    assert full3.payload_path == "/versions/3/full/payload" and store.companion(3) == full3
    steps = lambda a, b, **kw: [(m.version, m.kind) for m in store.sync_plan(a, b, **kw)]  # noqa: E731
    assert steps(2, 3) == [(3, "delta")]  # one version behind: the small delta, not the snapshot
    assert steps(None, 3) == [(3, "full")]  # a new worker: the snapshot alone, not 0 + three deltas
    assert steps(None, 4, compact=False) == [(3, "full"), (4, "delta")]
    assert steps(1, 4, compact=False) == [(2, "delta"), (3, "delta"), (4, "delta")]  # through the snapshot version
    # The plan's payloads rebuild the target bit for bit.
    out = states[1]
    for m in store.sync_plan(1, 4, compact=False):
        out = rd.apply(out, store.payload_path(m.version, m.kind).read_bytes())
    assert checksum(out) == checksum(states[4])
    assert checksum(state_from_bytes(store.payload_path(3, "full").read_bytes())) == checksum(states[3])
    # A compacted delta across the snapshot version composes through its companion delta.
    plan = store.sync_plan(1, 4)
    assert [(m.base_version, m.version, m.compacted) for m in plan] == [(1, 4, True)]
    assert checksum(rd.apply(states[1], store._file_of(plan[0]).read_bytes())) == checksum(states[4])
    # A restarted store reloads the companion.
    again = VersionStore(tmp_path, 4096, 50)
    assert again.companion(3) == full3 and [m.kind for m in again.sync_plan(2, 3)] == ["delta"]
    assert again.bytes_on_disk() == store.bytes_on_disk()


def test_companion_uploaded_after_the_snapshot_is_served_too(tmp_path) -> None:
    """Snapshot first, delta second (the other order): the delta is the companion, served from its own path."""
    from tests.weight_server.states import chain

    states = chain(4)
    store = VersionStore(tmp_path, 4096, 50)
    for v, kind in [(0, "full"), (1, "delta"), (2, "delta"), (3, "full"), (3, "delta")]:
        _put_version(store, states, v, kind)
    [m] = store.sync_plan(2, 3)
    assert (m.kind, m.companion, m.payload_path) == ("delta", True, "/versions/3/delta/payload")
    assert [x.kind for x in store.sync_plan(None, 3)] == ["full"]


def test_companion_uploads_that_do_not_fit_are_refused(tmp_path) -> None:
    from tests.weight_server.states import chain

    store = VersionStore(tmp_path, 4096, 50)
    states = chain(3)
    for v, kind in [(0, "full"), (1, "delta"), (2, "delta")]:
        _put_version(store, states, v, kind)
    for version, kind, checksum, base, refused, field in [
        (2, "full", "another-state", None, ErrorKind.CONFLICT, "checksum"),  # must produce the same state
        (1, "full", "wrong", None, ErrorKind.CONFLICT, "checksum"),
        (2, "delta", None, 1, ErrorKind.CONFLICT, "version"),  # same kind again: versions are immutable
    ]:
        with pytest.raises(StoreError) as err:
            store.begin_upload(version, kind, checksum or store.manifest(version).checksum, base_version=base)
        assert (err.value.kind, err.value.field) == (refused, field), (version, kind)
    _put_version(store, states, 2, "full")
    with pytest.raises(StoreError) as err:  # it already holds both kinds
        store.begin_upload(2, "full", store.manifest(2).checksum)
    assert (err.value.kind, err.value.field) == (ErrorKind.CONFLICT, "version")
    assert store.versions() == [0, 1, 2]


def test_retention_ends_chains_at_a_companion_snapshot_and_keeps_them_consistent(tmp_path) -> None:
    import rlboost.delta as rd
    from tests.weight_server.states import chain, checksum

    states = chain(6)
    store = VersionStore(tmp_path, 4096, retain_versions=2)
    for v in range(4):
        _put_version(store, states, v, "full" if v == 0 else "delta")
    assert store.versions() == [0, 1, 2, 3]  # 2 and 3 chain back to the snapshot 0
    _put_version(store, states, 3, "full")  # 3's companion snapshot: 2 still chains to 0
    assert store.versions() == [0, 1, 2, 3]
    _put_version(store, states, 4, "delta")
    assert store.versions() == [3, 4]  # newest two; 3 holds a snapshot, so nothing older is needed
    assert not (tmp_path / "versions" / "2").exists() and (tmp_path / "versions" / "3" / "full").is_dir()
    assert [(m.version, m.kind) for m in store.sync_plan(None, 4)] == [(3, "full"), (4, "delta")]
    # A worker still at 2 holds that state itself: the kept delta 2->3 serves it (compaction needs 2: skipped).
    plan = store.sync_plan(2, 4)
    assert [(m.version, m.kind) for m in plan] == [(3, "delta"), (4, "delta")]
    out = states[2]
    for m in plan:
        out = rd.apply(out, store.payload_path(m.version, m.kind).read_bytes())
    assert checksum(out) == checksum(states[4])
    _put_version(store, states, 5, "delta")
    assert store.versions() == [3, 4, 5]  # 4 and 5 chain back to 3's companion snapshot
    assert store.bytes_on_disk() == sum(
        m.total_bytes for v in (3, 4, 5) for m in (store.manifest(v), store.companion(v)) if m is not None
    )


def test_compaction_cache_is_bounded_by_bytes_least_recently_used_first(tmp_path) -> None:
    from tests.weight_server.states import chain

    states = chain(8)
    sizes = {}
    probe = VersionStore(tmp_path / "probe", 4096, 50)
    _put_chain(probe, states)
    for a in range(0, 5):
        sizes[a] = probe.compacted(a, 7).total_bytes  # what each compacted delta a->7 weighs
    cap = sizes[0] + sizes[1] + sizes[2] // 2  # room for two of the three below, not three
    evicted: list[int] = []
    store = VersionStore(tmp_path / "data", 4096, 50, compacted_cache_bytes=cap)
    store.on_compacted_evicted = evicted.append
    _put_chain(store, states)
    store.compacted(0, 7)
    store.compacted(1, 7)
    store.compacted(0, 7)  # used again: 1->7 is now the least recently used
    store.compacted(2, 7)
    assert evicted == [1] and store.compacted_evictions == 1
    assert sorted(d.name for d in (tmp_path / "data" / "compacted").iterdir()) == ["0-7", "2-7"]
    assert store.compacted_bytes() == sizes[0] + sizes[2] <= cap
    # A restart with a smaller cap evicts down to it; a delta larger than the whole cache is not built.
    small = VersionStore(tmp_path / "data", 4096, 50, compacted_cache_bytes=min(sizes.values()) - 1)
    assert small.compacted_count() == 0 and small.compacted_bytes() == 0
    with pytest.raises(StoreError) as err:
        small.compacted(3, 7)
    assert err.value.kind == ErrorKind.INVALID and "--compacted-cache-bytes" in err.value.message
    assert [m.version for m in small.sync_plan(3, 7)] == [4, 5, 6, 7]  # the chain is served instead


def test_compacted_deltas_are_built_one_at_a_time_whatever_the_readers(tmp_path, monkeypatch) -> None:
    """Issue 31: weight-server memory grew 69 -> 209 MB under valid compacted-delta reads, built on many of
    uvicorn's threads at once (bench/weight_server_memory_bench.py measures it). Eight readers asking for eight
    different pairs at once: the real builds happen one after another (the composer is wrapped to count them)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import rlboost.delta.compact as compact
    from tests.weight_server.states import chain

    store = VersionStore(tmp_path, 4096, 50)
    _put_chain(store, chain(6))
    real, lock = compact.compose_chain, threading.Lock()
    at_once, most = [0], [0]

    def counted(deltas):
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
        try:
            return real(deltas)
        finally:
            with lock:
                at_once[0] -= 1

    monkeypatch.setattr(compact, "compose_chain", counted)
    pairs = [(a, b) for a in range(6) for b in range(a + 2, 6)]
    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(lambda p: store.compacted(*p), pairs))
    assert [(m.base_version, m.version) for m in built] == pairs and most[0] == 1
