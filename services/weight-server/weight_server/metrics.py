"""Prometheus metrics of the weight-server, in a registry of their own (one per app instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class WeightServerMetrics:
    """Uploads, bytes served by sync path (delta, compacted, full), range requests, versions held, bytes on disk."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.uploads = Counter(
            "rlboost_weights_uploads_total", "Versions uploaded, by kind.", ["kind"], registry=self.registry
        )
        self.upload_bytes = Counter(
            "rlboost_weights_upload_bytes_total", "Payload bytes received, by kind.", ["kind"], registry=self.registry
        )
        self.rejected = Counter(
            "rlboost_weights_rejected_total", "Requests refused, by HTTP status.", ["status"], registry=self.registry
        )
        self.bytes_served = Counter(
            "rlboost_weights_bytes_served_total",
            "Payload bytes sent, by sync path: 'full' snapshot, stored 'delta', or 'compacted' delta.",
            ["path"],
            registry=self.registry,
        )
        self.range_requests = Counter(
            "rlboost_weights_range_requests_total", "Payload requests with a Range header.", registry=self.registry
        )
        self.announce_failures = Counter(
            "rlboost_weights_announce_failures_total", "NATS announcements that failed.", registry=self.registry
        )
        self.versions_held = Gauge("rlboost_weights_versions_held", "Versions on disk.", registry=self.registry)
        self.compacted_held = Gauge(
            "rlboost_weights_compacted_deltas_held", "Compacted deltas cached on disk.", registry=self.registry
        )
        self.compacted_bytes = Gauge(
            "rlboost_weights_compacted_bytes",
            "Bytes of compacted deltas cached on disk (bounded by --compacted-cache-bytes).",
            registry=self.registry,
        )
        self.compacted_evictions = Counter(
            "rlboost_weights_compacted_evictions_total",
            "Compacted deltas evicted from the cache to keep it within --compacted-cache-bytes.",
            registry=self.registry,
        )
        self.peers = Gauge(
            "rlboost_weights_peers", "Workers registered as peers that serve weights (fan-out).", registry=self.registry
        )
        self.source_answers = Counter(
            "rlboost_weights_source_answers_total",
            "Answers to 'where do I pull this payload': 'relay' (from the weight-server) or 'peers'.",
            ["kind"],
            registry=self.registry,
        )
        self.bytes_on_disk = Gauge("rlboost_weights_bytes_on_disk", "Payload bytes on disk.", registry=self.registry)
        self.slow_closed = Counter(
            "rlboost_weights_slow_requests_closed_total",
            "Connections closed for a slow client (weight_server.deadlines): 'header' (no whole request header "
            "within --header-timeout), 'body' (no body byte for --body-timeout while the server waited).",
            ["phase"],
            registry=self.registry,
        )
        # issue 34: a puller reports a peer that sent nothing, so that new workers skip it until it heartbeats
        self.peer_stalled = Counter(
            "rlboost_weights_peer_stalled_reports_total",
            "Reports by pullers of a peer that sent no byte within their peer timeout or could not be reached "
            "(the peer is not offered again until its next heartbeat).",
            registry=self.registry,
        )
        # issue 31: the peer directory's entries are bound to the worker that proves its id; the refusals
        self.peer_refused = Counter(
            "rlboost_weights_peer_refused_total",
            "Peer directory calls refused: 'unauthenticated' (no or an invalid identity proof), 'denied' (another "
            "worker's proof), 'full' (the directory holds its bound of workers).",
            ["reason"],
            registry=self.registry,
        )
