"""A worker's side of peer weight fan-out: serve what it holds, register it, and ask where to pull from.

    fanout = PeerFanout(client, worker_id="spot-3", zone="us-east1-b", region="us-east1", cache_dir=tmp)
    await fanout.start(host="0.0.0.0", port=0, advertise="10.0.3.7")   # then every client.pull uses peers
    ...
    await fanout.close()

`start` runs the peer server (rlboost.weights.peer_serve) in this event loop, registers with the weight-server's
source directory (rlboost.weights.peers) and heartbeats every `heartbeat_s`, telling it the payloads held whole.
The client (rlboost.weights.client.WeightClient) asks `sources(manifest)` before each pull and keeps each verified
chunk in the cache for others. A directory that cannot be reached only means pulling from the weight-server.
This module builds on the client; the client knows fan-out only as what a pull needs of it (client.PeerSources).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from rlboost.weights.client import WeightClient, WeightServerError
from rlboost.weights.peer_serve import PayloadCache, PeerServer, wait_event
from rlboost.wire.peers_io import PeerRegistration, Source
from rlboost.wire.weights_io import Manifest

log = logging.getLogger(__name__)


class PeerFanout:
    """Registration, heartbeats and source queries of one worker; attach with `start` (sets client.fanout)."""

    def __init__(
        self,
        client: WeightClient,
        worker_id: str,
        cache_dir: str | Path,
        zone: str = "",
        region: str = "",
        token: str | None = None,
        heartbeat_s: float = 10.0,
        keep: int = 4,
        on_served: Callable[[int], None] | None = None,
        identity: Callable[[], str] = str,
    ) -> None:
        """`token`: the job's worker token, which pullers must present to this worker's peer server; `identity`:
        reads this worker's identity proof afresh (a rotated token counts), which the directory binds its entry to."""
        self.client, self.worker_id, self.zone, self.region = client, worker_id, zone, region
        self.identity = identity
        self.heartbeat_s = heartbeat_s
        self.cache = PayloadCache(cache_dir, keep=keep)
        self.server = PeerServer(self.cache, token=token, on_served=on_served)
        self.url = ""
        self.relay_pulls = 0  # payloads this worker was told to pull across its region's boundary
        self._beat: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self._reports: set[asyncio.Task] = set()  # stalled-peer reports in flight

    async def start(self, host: str, port: int, advertise: str = "") -> str:
        """Serve on host:port (0: any free port), register, heartbeat; returns the advertised base URL."""
        self.url = await self.server.start(host, port, advertise)
        self.client.fanout = self
        try:
            await self._register()
        except WeightServerError as err:  # not up yet: the heartbeat registers it; pulls go to the server till then
            log.warning("peer registration failed; retrying at the next heartbeat", extra={"error": str(err)})
        self._beat = asyncio.create_task(self._heartbeat())
        return self.url

    async def sources(self, manifest: Manifest) -> list[Source]:
        """The sources of a payload, best first (the weight-server last); only the weight-server when the
        directory cannot be asked."""
        try:
            found = await self.client.peer_sources(self.worker_id, manifest.payload_path, self.identity())
        except (WeightServerError, ValueError) as err:
            log.warning("peer directory unavailable; pulling from the weight-server", extra={"error": str(err)})
            return []
        self.relay_pulls += found.relay
        return found.sources

    def held_changed(self) -> None:
        """A payload became whole: tell the directory now rather than at the next heartbeat."""
        self._wake.set()

    def peer_stalled(self, source: Source) -> None:
        """Report a peer that sent nothing to the directory, beside the pull (which goes on to its next source)."""
        task = asyncio.get_running_loop().create_task(self._report_stalled(source.worker))
        self._reports.add(task)
        task.add_done_callback(self._reports.discard)

    async def reports_sent(self) -> None:
        """Wait until the stalled-peer reports made so far have been answered (or failed)."""
        await asyncio.gather(*self._reports, return_exceptions=True)

    async def _report_stalled(self, peer: str) -> None:
        try:
            await self.client.report_stalled(self.worker_id, peer, self.identity())
        except WeightServerError as err:  # the TTL still forgets a peer that stays silent
            log.warning("stalled peer report failed", extra={"peer": peer, "error": str(err)})

    async def close(self) -> None:
        for task in list(self._reports):
            task.cancel()
        await self.reports_sent()
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        self.client.fanout = None
        with contextlib.suppress(WeightServerError):
            await self.client.leave_peer(self.worker_id, self.identity())
        await self.server.stop()
        self.cache.close()

    async def _register(self) -> None:
        reg = PeerRegistration(url=self.url, zone=self.zone, region=self.region, holds=self.cache.held())
        await self.client.register_peer(self.worker_id, reg, self.identity())

    async def _heartbeat(self) -> None:
        while True:
            await wait_event(self._wake, self.heartbeat_s)  # a heartbeat period, or news
            self._wake.clear()
            try:
                await self._register()
            except WeightServerError as err:  # the weight-server restarts: registered again at the next beat
                log.warning("peer heartbeat failed", extra={"error": str(err)})
