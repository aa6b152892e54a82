"""The weight-server's routes (rlboost.wire.weight_routes) are the paths already on the wire: server, clients and
peers name them from that one module, so a change there would move them all at once; these pin them."""

from __future__ import annotations

from rlboost.wire import weight_routes as routes
from rlboost.wire.weights_io import Manifest

SHA = "0" * 64


def test_the_functions_fill_in_the_paths_on_the_wire():
    assert routes.api(routes.VERSIONS) == "/v1/versions"
    assert routes.api(routes.version(7)) == "/v1/versions/7"
    assert routes.api(routes.manifest(7)) == "/v1/versions/7/manifest"
    assert routes.api(routes.payload(7)) == "/v1/versions/7/payload"
    assert routes.api(routes.payload(7, "delta")) == "/v1/versions/7/delta/payload"
    assert routes.api(routes.SYNC) == "/v1/sync"
    assert routes.api(routes.compacted_manifest(2, 7)) == "/v1/compacted/2/7/manifest"
    assert routes.api(routes.compacted_payload(2, 7)) == "/v1/compacted/2/7/payload"
    assert routes.api(routes.ASSETS) == "/v1/assets"
    assert routes.api(routes.asset("config.json")) == "/v1/assets/config.json"
    assert routes.api(routes.peer("spot-3")) == "/v1/peers/spot-3"
    assert routes.api(routes.SOURCES) == "/v1/sources"
    assert (routes.HEALTHZ, routes.METRICS) == ("/healthz", "/metrics")


def test_the_templates_are_what_the_server_routes_on():
    assert routes.api(routes.KIND_PAYLOAD) == "/v1/versions/{version}/{kind}/payload"
    assert routes.api(routes.COMPACTED_PAYLOAD) == "/v1/compacted/{base}/{version}/payload"
    assert routes.api(routes.PEER) == "/v1/peers/{worker}"


def test_a_manifests_payload_path_is_its_route_under_the_prefix():
    common = {"checksum": "c", "total_bytes": 0, "sha256": SHA, "chunk_bytes": 0}
    assert Manifest(version=3, kind="full", **common).payload_path == "/versions/3/payload"
    companion = Manifest(version=3, kind="delta", base_version=2, companion=True, **common)
    assert companion.payload_path == "/versions/3/delta/payload"
    compacted = Manifest(version=5, kind="delta", base_version=1, compacted=True, **common)
    assert compacted.payload_path == "/compacted/1/5/payload"
