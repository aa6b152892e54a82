"""The weight-server's HTTP routes, each spelled once: the server declares them, every client builds its paths here.

The API's routes are relative to API_PREFIX (`api(route)` is the full path a request names). A payload's route
under the prefix is also its name between workers: the path peers register as held and are asked for
(Manifest.payload_path, rlboost.wire.peers_io), and a peer serves it at the same full path as the weight-server.
Templates (`{version}`, `{name}`...) are what the server routes on; the functions fill them in for a client.
HEALTHZ and METRICS are outside the API (unauthenticated: probes and Prometheus); every service answers them (the
others through rlboost.observability), so health checks of any service name them from here.
"""

from __future__ import annotations

from rlboost.wire.service_routes import HEALTHZ, METRICS

__all__ = ["HEALTHZ", "METRICS"]  # re-exported: the weight-server's clients find every route here

API_PREFIX = "/v1"

VERSIONS = "/versions"  # GET: VersionList
VERSION = VERSIONS + "/{version}"  # PUT: upload a version's payload
MANIFEST = VERSION + "/manifest"  # GET (?kind=full|delta)
PAYLOAD = VERSION + "/payload"  # GET (Range)
KIND_PAYLOAD = VERSION + "/{kind}/payload"  # GET (Range): a version held in both kinds, that kind's payload
SYNC = "/sync"  # GET ?from=A&to=B[&compact=0]: list[Manifest]
COMPACTED = "/compacted/{base}/{version}"
COMPACTED_MANIFEST = COMPACTED + "/manifest"  # GET: the composed base->version delta's manifest
COMPACTED_PAYLOAD = COMPACTED + "/payload"  # GET (Range)
ASSETS = "/assets"  # GET: AssetList
ASSET = ASSETS + "/{name}"  # GET, PUT: one model asset
PEER = "/peers/{worker}"  # PUT (register, heartbeat), DELETE (leave)
SOURCES = "/sources"  # POST: SourcesRequest -> SourceList
STALLED = "/stalled"  # POST: StalledPeer (a puller's peer sent nothing: not offered until it heartbeats)


def api(route: str) -> str:
    """A route's full path on the server."""
    return API_PREFIX + route


def version(v: int) -> str:
    return VERSION.format(version=v)


def manifest(v: int) -> str:
    return MANIFEST.format(version=v)


def payload(v: int, kind: str | None = None) -> str:
    """The payload of version `v`; with `kind`, that kind's payload of a version held in both."""
    return PAYLOAD.format(version=v) if kind is None else KIND_PAYLOAD.format(version=v, kind=kind)


def compacted_manifest(base: int, v: int) -> str:
    return COMPACTED_MANIFEST.format(base=base, version=v)


def compacted_payload(base: int, v: int) -> str:
    return COMPACTED_PAYLOAD.format(base=base, version=v)


def asset(name: str) -> str:
    return ASSET.format(name=name)


def peer(worker: str) -> str:
    return PEER.format(worker=worker)
