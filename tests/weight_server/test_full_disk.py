"""The weight-server on a full disk (issue 31 item 2): its data directory on a real 1 MiB tmpfs (tests/small_fs.py).

An upload it cannot store is refused with 507 and one line naming the data directory and the field to change;
nothing of it stays in incoming/; every version it held is kept and served, also after a restart; once space is
freed the same upload goes through. A compacted delta that does not fit is not built: the chain is served.
"""

from __future__ import annotations

import httpx

from rlboost.wire.weights_io import HEADER_CHECKSUM, HEADER_KIND
from tests.small_fs import fill, mounted_tmpfs
from tests.weight_server.servers import TOKEN, ThreadServer
from weight_server.store import VersionStore

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _put(c: httpx.Client, version: int, data: bytes) -> httpx.Response:
    return c.put(
        f"/v1/versions/{version}", content=data, headers={**AUTH, HEADER_KIND: "full", HEADER_CHECKSUM: f"s{version}"}
    )


def test_an_upload_that_does_not_fit_is_refused_and_every_version_held_is_kept() -> None:
    with mounted_tmpfs("1m") as root:
        data = root / "data"
        with ThreadServer(data, chunk_bytes=4096) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
            first = b"v0" * 100_000  # 200 kB
            assert _put(c, 0, first).status_code == 200
            r = _put(c, 1, b"v1" * 600_000)  # 1.2 MB: more than the file system holds
            assert r.status_code == 507, r.text
            body = r.json()
            assert "no space left on device" in body["error"] and str(data) in body["error"]
            assert body["field"] == "weightSync.retainVersions" and "\n" not in body["error"]
            assert srv.store.versions() == [0] and srv.store.uploading() == []
            assert list((data / "incoming").iterdir()) == []  # nothing partial left behind
            assert c.get("/v1/versions/0/payload", headers=AUTH).content == first
            filler = fill(root)  # the disk stays full: a small upload is refused too, and v0 still kept
            assert _put(c, 1, b"x" * 8192).status_code == 507 and srv.store.versions() == [0]
            filler.unlink()
            assert _put(c, 1, b"v1" * 100_000).status_code == 200  # space again: the same version goes through
        again = VersionStore(data, 4096, retain_versions=20)  # a restart reloads what was committed
        assert again.versions() == [0, 1] and again.manifest(0).total_bytes == len(first)


def test_a_compacted_delta_that_does_not_fit_is_not_built_and_the_chain_is_served() -> None:
    """Real rlboost deltas (compose_chain needs them), then the disk is filled before the first sync plan."""
    from tests.weight_server.states import chain
    from tests.weight_server.test_store import _put_chain

    with mounted_tmpfs("2m") as root:
        store = VersionStore(root / "data", 4096, retain_versions=20)
        _put_chain(store, chain(4))
        fill(root)
        plan = store.sync_plan(1, 3)
        assert [(m.version, m.compacted) for m in plan] == [(2, False), (3, False)]
        assert list((root / "data" / "incoming").iterdir()) == [] and store.compacted_count() == 0
        assert store.versions() == [0, 1, 2, 3]
