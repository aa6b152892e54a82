"""One weights-client node of the fan-out bench (bench/fanout_bench.py) and of the relay-kill e2e test: a worker's
weight path without the engine. It serves what it holds to peers, waits for `go` on stdin, pulls one version and
reports, then keeps serving until stdin closes or it is killed.

    python bench/fanout_node.py --server http://10.77.0.1:8600 --worker n3 --region r1 --zone r1a \\
        --host 0.0.0.0 --advertise 10.77.0.5 --version 0 [--token T] [--no-peers]

Lines on stdout (JSON, one per event): {"event": "ready", "url"}, {"event": "sources", "relay"},
{"event": "served", "bytes"} (the first range served to a peer), {"event": "done", "seconds", "t_done",
"bytes", "peer_bytes", "peer_failures"} (t_done: time.monotonic(), one clock for every process of the machine), and
{"event": "stats", "served_bytes", "sha256"} for each `stats` line on stdin after that: the bench asks once the wave's
CPU seconds are taken, so the whole payload's sha256 (its end-to-end bit-exactness check) is not counted in them.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from rlboost.weights.client import WeightClient  # noqa: E402
from rlboost.weights.fanout import PeerFanout  # noqa: E402


def say(**event: object) -> None:
    print(json.dumps(event), flush=True)


async def main(a: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with WeightClient(a.server, token=a.token or None, streams=a.streams) as client:
        fanout = None
        if not a.no_peers:
            first = [True]

            def served(nbytes: int) -> None:
                if first[0]:
                    first[0] = False
                    say(event="served", bytes=nbytes)

            fanout = PeerFanout(
                client,
                a.worker,
                tempfile.mkdtemp(prefix="fanout-node-"),
                a.zone,
                a.region,
                a.token or None,
                heartbeat_s=2.0,
                on_served=served,
            )
            await fanout.start(a.host, 0, a.advertise)
            sources = fanout.sources

            async def told(m):  # report whether the directory made this node its region's relay
                found = await sources(m)
                say(event="sources", relay=fanout.relay_pulls > 0, peers=[s.worker for s in found if s.url])
                return found

            fanout.sources = told  # type: ignore[method-assign]
        say(event="ready", url=fanout.url if fanout else "")
        await reader.readline()  # "go"
        m = await client.manifest(a.version)
        started = time.monotonic()
        payload = await client.pull(m)
        done = time.monotonic()
        stats = client.last_pull
        say(
            event="done",
            seconds=done - started,
            t_done=done,
            t_start=started,
            bytes=len(payload),
            peer_bytes=stats.peer_bytes,
            peer_failures=stats.peer_failures,
        )
        while line := await reader.readline():  # serve until stdin closes; "stats" asks what was served so far
            if line.strip() == b"stats":  # and the whole payload's sha256: the bench's end-to-end check
                digest = hashlib.sha256(payload).hexdigest()
                say(event="stats", served_bytes=fanout.server.bytes_served if fanout else 0, sha256=digest)
        if fanout is not None:
            await fanout.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--zone", default="")
    p.add_argument("--region", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--advertise", default="")
    p.add_argument("--version", type=int, default=0)
    p.add_argument("--token", default="")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--no-peers", action="store_true", help="pull from the weight-server only (the baseline)")
    asyncio.run(main(p.parse_args()))
