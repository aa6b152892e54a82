"""The weight-distribution model: how long a wave of k pullers takes to reach a payload, and what the server sends.

Pure functions over a `WeightNetwork` (links in bytes/s, latencies in seconds). Two ways to distribute:

- server-only: every puller fetches the whole payload from the one weight-server, so the server's egress link
  is shared by the wave (k x payload / server link), and pullers in another region share the region link too;
- relays (rlboost.weights.peers, the product's default): per region the first puller is a relay and pulls from
  the weight-server (across the region link when it is far), the others chain behind it, each serving every
  chunk as soon as it has verified it (pipelined): a region's wave costs the payload's time on its slowest link
  plus one chunk time and one hop latency per puller in the chain (docs/benchmarks.md "fan-out" measured it);
  never slower than server-only, since every puller may also take the payload from the weight-server.

The same model times a new instance's first snapshot (cold start) and every running instance's per-version delta.
Pullers are spread round-robin over `regions`; the weight-server sits in region 0.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_LATENCY_S = 0.05  # request + first byte from the weight-server (the simulator's sync_seconds latency)


@dataclass(frozen=True)
class WeightNetwork:
    """Links and latencies of weight distribution; defaults are stated in docs/simulation.md."""

    server_link_bytes_s: float = 100e9 / 8  # the weight-server's egress: one 100 Gbit/s NIC
    node_link_bytes_s: float = 50e9 / 8  # one spot VM's link (ClusterConfig.spot_link_bytes_s)
    region_link_bytes_s: float = 10e9 / 8  # between regions, per direction
    region_latency_s: float = 0.04  # one cross-region round trip
    hop_latency_s: float = 0.001  # one peer-to-peer hop inside a region
    chunk_bytes: float = 256 * 1024  # the weights protocol's chunk (pipelining unit of a chain)
    regions: int = 1  # spot VMs are spread round-robin over this many regions

    def per_region(self, k: int) -> list[int]:
        """Pullers of a wave of k in each region (round-robin; region 0 holds the weight-server)."""
        return [k // self.regions + (1 if r < k % self.regions else 0) for r in range(self.regions)]


def wave_seconds(payload_bytes: float, k: int, net: WeightNetwork, relays: bool) -> float:
    """Time until the last of k pullers (starting together) holds a payload of `payload_bytes`; 0 when k is 0."""
    if k <= 0:
        return 0.0
    counts = net.per_region(k)
    server_only = _server_only_seconds(payload_bytes, counts, net)
    if not relays:
        return server_only
    # a puller's source list ends with the weight-server (peers.py), so a chain never makes a wave slower than
    # the server alone would: a small wave on a fat server link takes the payload straight from it
    sources = sum(1 for n in counts if n)
    chains = max(_relay_region_seconds(payload_bytes, n, r, sources, net) for r, n in enumerate(counts) if n)
    return min(chains, server_only)


def server_egress_bytes(payload_bytes: float, k: int, net: WeightNetwork, relays: bool) -> float:
    """Bytes the weight-server sends for a wave of k: one payload per region with pullers (relays), else k."""
    if k <= 0:
        return 0.0
    sources = sum(1 for n in net.per_region(k) if n) if relays else k
    return sources * payload_bytes


def _server_only_seconds(payload_bytes: float, counts: list[int], net: WeightNetwork) -> float:
    """Every puller from the server: bound by the shared server link, the far regions' links and one node link."""
    k, far = sum(counts), sum(counts[1:])
    server = k * payload_bytes / net.server_link_bytes_s
    node = payload_bytes / net.node_link_bytes_s
    region = far * payload_bytes / net.region_link_bytes_s if far else 0.0
    latency = SERVER_LATENCY_S + (net.region_latency_s if far else 0.0)
    return latency + max(server, node, region)


def _relay_region_seconds(payload_bytes: float, n: int, region: int, relays: int, net: WeightNetwork) -> float:
    """One region's chain: the relay's pull (the `relays` share the server link) plus a pipelined chain of n - 1."""
    links = [payload_bytes / net.node_link_bytes_s, relays * payload_bytes / net.server_link_bytes_s]
    latency = SERVER_LATENCY_S
    if region > 0:
        links.append(payload_bytes / net.region_link_bytes_s)
        latency += net.region_latency_s
    hop = min(net.chunk_bytes, payload_bytes) / net.node_link_bytes_s + net.hop_latency_s
    return latency + max(links) + (n - 1) * hop
