"""A lying peer, run as its own process by test_weights_fanout.py: it pulls a version from the weight-server, flips
one byte of one chunk, registers with the directory as a holder of that payload and serves the corrupt bytes.

    python -m tests.rlboost.corrupt_peer WEIGHT_SERVER_URL VERSION CHUNK_INDEX CACHE_DIR

Prints `serving <url>` once registered, then serves until killed.
"""

from __future__ import annotations

import asyncio
import sys

from rlboost.weights.client import WeightClient
from rlboost.weights.fanout import PeerFanout


async def main(url: str, version: int, bad_chunk: int, cache_dir: str) -> None:
    async with WeightClient(url) as client:
        m = await client.manifest(version)
        payload = await client.pull(m)
        chunk = m.chunks[bad_chunk]
        payload[chunk.offset] ^= 0xFF
        fanout = PeerFanout(client, "liar", cache_dir, zone="z", region="r", heartbeat_s=0.5)
        entry = fanout.cache.begin(m)
        for c in m.chunks:  # marked verified although one is not: a peer that lies
            await entry.chunk_verified(c, memoryview(payload)[c.offset : c.offset + c.length])
        entry.finish()
        served = await fanout.start("127.0.0.1", 0)
        print(f"serving {served}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
