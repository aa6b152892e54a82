"""The source directory of peer weight fan-out: which workers hold which payload, and whom a puller fetches from.

Pure (no I/O; the clock is handed in), kept by the weight-server (weight_server.app) and unit-tested alone.

Per payload, the pullers of a region form a chain in the order they asked: the first is the region's relay and
pulls from the weight-server (the payload crosses the region boundary once); each later puller fetches from the
puller before it in its region, which serves every chunk as soon as it has verified it (pipelined: a wave of N
costs the payload's time on one link plus N chunk times, not N payloads through one server link). Workers that
already hold the payload whole come first, same zone before same region, rotated so that pullers spread over
them. Peers of other regions are never offered. The weight-server is always the last source, so a peer that
dies or lies costs a retry, never a sync.

A peer that stops heartbeating for `ttl_s` is forgotten (and so is its place in the chains): the next puller
of its region takes its place, and the region's relay is re-chosen when the relay leaves. One that a puller reports
stalled (report_stalled) is offered to no one from then until its next heartbeat. The directory holds at
most `max_entries` peers (a new worker past it is refused: DirectoryFull); expired ones go first. Who may write an
entry is the weight-server's check: each entry is bound to the worker that proves its id (issue 31 item 3).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlboost.wire.peers_io import PeerRegistration, Source, SourceList

MAX_TRACKED_PAYLOADS = 256  # chains of payloads no live peer holds or pulls are dropped past this many
MAX_ENTRIES = 4096  # peers held at once: a job's workers, with room; a registration past it is refused


class DirectoryFull(Exception):  # noqa: N818 (a refusal)
    """A new peer while the directory holds `max_entries` live ones."""


@dataclass
class Peer:
    """A registered worker: where it serves, where it runs, what it holds, when it was last heard from."""

    worker: str
    url: str
    zone: str
    region: str
    seen: float
    holds: frozenset[str] = frozenset()
    stalled_by: str = ""  # a puller reported it sent nothing (report_stalled): not offered until it heartbeats again


SERVER = Source(url="", worker="", tier="server")


def _tier(me: Peer, other: Peer) -> str | None:
    """'zone' or 'region' when `other` is near `me`; None for another region (or an unknown one)."""
    if other.region != me.region:
        return None
    return "zone" if other.zone == me.zone and me.zone else "region"


def _spread(peers: Sequence[Peer], key: str) -> list[Peer]:
    """`peers` rotated by a hash of `key` (the puller), so that pullers spread over the holders."""
    if not peers:
        return []
    start = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % len(peers)
    return [*peers[start:], *peers[:start]]


def order_sources(me: Peer, holders: Sequence[Peer], ahead: Sequence[Peer], max_peers: int) -> SourceList:
    """The sources of one payload for `me`: holders (whole) in its zone, then in its region, then its chain parent
    (the nearest puller ahead of it in its region, pulling still), then the weight-server.

    `holders` and `ahead` are in registration / arrival order; peers of other regions are left out, so only a
    region's relay fetches across the boundary. `me` is a relay when it has no peer source at all."""
    near = [p for p in holders if p.worker != me.worker and _tier(me, p)]
    zone = _spread([p for p in near if _tier(me, p) == "zone"], me.worker)
    region = _spread([p for p in near if _tier(me, p) == "region"], me.worker)
    chosen = [Source(url=p.url, worker=p.worker, tier=_tier(me, p)) for p in [*zone, *region][:max_peers]]
    parents = [p for p in ahead if p.worker != me.worker and _tier(me, p)]
    if parents and len(chosen) < max_peers:
        parent = parents[-1]
        chosen.append(Source(url=parent.url, worker=parent.worker, tier=_tier(me, parent), complete=False))
    return SourceList(sources=[*chosen, SERVER], relay=not chosen)


@dataclass
class PeerDirectory:
    """Registered peers and, per payload path, the order its pullers asked in."""

    ttl_s: float = 30.0
    max_peers: int = 4
    max_entries: int = MAX_ENTRIES
    peers: dict[str, Peer] = field(default_factory=dict)
    pullers: dict[str, list[str]] = field(default_factory=dict)  # payload path -> worker ids, arrival order

    def register(self, worker: str, reg: PeerRegistration, now: float) -> None:
        """Register or heartbeat `worker`; its `holds` replace what it held before. DirectoryFull for a new
        worker while `max_entries` live peers are held."""
        if worker not in self.peers and len(self.peers) >= self.max_entries and not self.expire(now):
            raise DirectoryFull(f"the peer directory holds {self.max_entries} workers, its bound")
        self.peers[worker] = Peer(worker, reg.url, reg.zone, reg.region, now, frozenset(reg.holds))

    def leave(self, worker: str) -> None:
        self.peers.pop(worker, None)
        for order in self.pullers.values():
            if worker in order:
                order.remove(worker)

    def expire(self, now: float) -> list[str]:
        """Forget the peers not heard from within `ttl_s`; returns their ids."""
        gone = [w for w, p in self.peers.items() if now - p.seen > self.ttl_s]
        for w in gone:
            self.leave(w)
        return gone

    def report_stalled(self, reporter: str, worker: str) -> bool:
        """A registered puller (`reporter`) found `worker` stalled or unreachable (no byte within its peer timeout,
        or no connection): it is offered to no one, as holder or as chain link, until it registers or heartbeats
        again. A frozen peer (a VM paused or gone without a TCP reset) does not heartbeat, so every new worker
        would otherwise try it for its peer timeout until the TTL expires it. A false report costs the reported
        peer at most one heartbeat period of serving. Returns whether the report was taken."""
        peer = self.peers.get(worker)
        if reporter not in self.peers or peer is None or reporter == worker:
            return False
        peer.stalled_by = reporter
        return True

    def sources(self, worker: str, path: str, now: float) -> SourceList:
        """Where `worker` should fetch the payload at `path`; an unregistered puller gets the weight-server only."""
        self.expire(now)
        me = self.peers.get(worker)
        if me is None:
            return SourceList(sources=[SERVER], relay=True)
        order = self.pullers.setdefault(path, [])
        if worker not in order:
            order.append(worker)
        self._bound()
        live = {w: p for w, p in self.peers.items() if not p.stalled_by}
        holders = [p for p in live.values() if path in p.holds]
        mine = order.index(worker)
        ahead = [live[w] for w in order[:mine] if w in live and path not in live[w].holds]
        return order_sources(me, holders, ahead, self.max_peers)

    def relays(self, path: str) -> dict[str, str]:
        """Per region, the worker that fetches `path` across its boundary (the first live puller there)."""
        out: dict[str, str] = {}
        for w in self.pullers.get(path, []):
            p = self.peers.get(w)
            if p is not None and p.region not in out:
                out[p.region] = w
        return out

    def _bound(self) -> None:
        """Drop the oldest chains once too many payloads are tracked (a long run sees thousands of versions)."""
        while len(self.pullers) > MAX_TRACKED_PAYLOADS:
            self.pullers.pop(next(iter(self.pullers)))
