"""A lagging worker's catch-up (issue 34): k = 1, 5 and 20 versions behind, from the weight-server alone or with a
peer, with the server's compacted delta or the plain delta chain.

    .venv/bin/python bench/catchup_bench.py                          # rich table
    .venv/bin/python bench/catchup_bench.py --params 32e6 --lags 1,5,20 --json catchup.json

A synthetic bf16 state (bench/weight_sync_bench.py's make_states: `--params`, ~1% of elements nudged by a few ulps
per version) is published to a real weight-server process as the trainer publishes it in `delta` mode: version 0
full, then a delta per version up to 20. A peer (a real PeerFanout with its peer server, registered in the
weight-server's directory) pulled every delta as a worker keeping up does, and keeps the last `--keep` payloads (the
worker's default, 4). Then a worker holding version 20 - k pulls version 20 through rollout_worker's WeightPuller
(the real sync plan, apply and whole-state checksum), in four ways:

* `server, compacted`: the weight-server alone; its plan picks the fewest bytes (a compacted k-step delta);
* `server, chain`: the weight-server alone, no compaction: what a job with signed manifests gets (a compacted delta
  carries no trainer signature, so a verifying worker asks for plans without them);
* `peers, compacted` / `peers, chain`: the same with the worker's own PeerFanout: payloads a peer holds come from it.

Per row: bytes pulled, of them from peers (`peer_bytes`), seconds (`catch_up_s`), the plan's paths, bit-exact.
Everything runs on 127.0.0.1 with no link shaping, so seconds are this machine's CPU (decode, apply, hash) rather
than a network's; bytes, and where they came from, are what carries over to a cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "services" / "rollout-worker", ROOT / "services" / "weight-server", ROOT / "bench"):
    sys.path.insert(0, str(extra))

from weight_sync_bench import TOKEN, make_states, spawn_server  # noqa: E402  (beside this file)

VERSIONS = 20


def chain(params: int, fraction: float, versions: int) -> list[dict]:
    """States 0..versions: version 0 is make_states' v0; each next one nudges `fraction` of the elements by 1-3
    ulps (bit patterns +-1..3), as Adam steps at a small learning rate do after bf16 rounding."""
    import torch

    states = [make_states(params, fraction)[0]]
    g = torch.Generator().manual_seed(1)
    for _ in range(versions):
        nxt = {}
        for name, t in states[-1].items():
            new = t.clone()
            flat = new.view(-1).view(torch.int16)
            idx = torch.randint(0, flat.numel(), (int(flat.numel() * fraction),), generator=g)
            step = torch.randint(1, 4, (idx.numel(),), generator=g, dtype=torch.int16)
            flat[idx] += step * (torch.randint(0, 2, (idx.numel(),), generator=g, dtype=torch.int16) * 2 - 1)
            nxt[name] = new
        states.append(nxt)
    return states


async def publish(url: str, states: list[dict]) -> list[int]:
    """Version 0 full, then one delta per version; the delta payloads' bytes."""
    import rlboost.delta as rd
    from rlboost.weights.checksum import state_checksum
    from rlboost.weights.client import WeightClient
    from rlboost.weights.safetensors_io import state_to_bytes

    sizes = []
    async with WeightClient(url, token=TOKEN) as wc:
        await wc.upload(0, state_to_bytes(states[0]), kind="full", checksum=state_checksum(states[0]))
        for v in range(1, len(states)):
            payload = rd.encode(states[v - 1], states[v], base_version=v - 1, version=v)
            sizes.append(len(payload))
            sums = state_checksum(states[v])
            await wc.upload(v, payload, kind="delta", checksum=sums, base_version=v - 1, fmt="rlboost-delta")
    return sizes


def client_class():
    """A WeightClient that can be told not to ask for compacted deltas, and sums the peer bytes of every payload."""
    from rlboost.weights.client import WeightClient

    class CatchUpClient(WeightClient):
        compact = True
        peer_total = 0

        async def sync_plan(self, from_version, to_version=None, compact=True):
            return await super().sync_plan(from_version, to_version, compact and self.compact)

        async def pull(self, version, *args, **kwargs):
            out = await super().pull(version, *args, **kwargs)
            self.peer_total += self.last_pull.peer_bytes
            return out

    return CatchUpClient


async def start_peer(url: str, name: str, keep: int, tmp: Path, client=None):
    """A PeerFanout serving on 127.0.0.1 (a fresh client unless given); (client, fanout)."""
    from rlboost.weights.fanout import PeerFanout

    client = client or client_class()(url, token=TOKEN)
    await client.__aenter__()
    fanout = PeerFanout(client, name, tmp / name, token=TOKEN, heartbeat_s=0.5, keep=keep)
    await fanout.start("127.0.0.1", 0)
    return client, fanout


async def keep_up(url: str, keep: int, tmp: Path):
    """The peer: pulls every delta as a worker keeping up would, then tells the directory what it holds (as its next
    heartbeat would)."""
    from rlboost.wire.peers_io import PeerRegistration

    client, fanout = await start_peer(url, "peer-0", keep, tmp)
    for v in range(1, VERSIONS + 1):
        await client.pull(await client.manifest(v, kind="delta"))
    held = fanout.cache.held()
    if not held:
        raise SystemExit("the peer holds no payload after pulling every delta: its cache kept nothing")
    await client.register_peer("peer-0", PeerRegistration(url=fanout.url, holds=held), "")
    return client, fanout, len(held)


async def catch_up(url: str, states: list[dict], sums: list[str], k: int, peers: bool, compact: bool, tmp: Path):
    from rollout_worker.weights import PulledWeights, WeightPuller

    client = client_class()(url, token=TOKEN)
    client.compact = compact
    fanout = None
    if peers:
        client, fanout = await start_peer(url, f"lagging-{k}-{int(compact)}", 4, tmp, client)
    else:
        await client.__aenter__()
    try:
        puller = WeightPuller(client)
        base = VERSIONS - k
        puller.held = PulledWeights(base, {n: t.clone() for n, t in states[base].items()}, sums[base], 0, 0.0)
        t0 = time.monotonic()
        pulled = await puller.pull(VERSIONS)
        seconds = time.monotonic() - t0
    finally:
        if fanout is not None:
            await fanout.close()
        await client.__aexit__(None, None, None)
    return {
        "k": k,
        "source": "peers" if peers else "server",
        "plan": "compacted" if compact else "chain",
        "bytes": pulled.nbytes,
        "peer_bytes": client.peer_total,
        "server_bytes": pulled.nbytes - client.peer_total,
        "catch_up_s": round(seconds, 3),  # the name for it
        "paths": pulled.paths,
        "bit_exact": pulled.checksum == sums[VERSIONS] and not pulled.fallback,
    }


async def bench(args: argparse.Namespace) -> dict:
    from rlboost.nats_server import free_port, wait_for_port
    from rlboost.weights.checksum import state_checksum

    states = chain(int(args.params), args.fraction, VERSIONS)
    sums = [state_checksum(s) for s in states]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlboost-catchup-") as tmp:
        port = free_port()
        server = spawn_server(Path(tmp) / "ws", port, args.chunk_bytes)
        try:
            wait_for_port("127.0.0.1", port, 60)
            url = f"http://127.0.0.1:{port}"
            deltas = await publish(url, states)
            peer_client, peer, held = await keep_up(url, args.keep, Path(tmp))
            for compact in (True, False):  # warm-up: the delta codec's kernels, the server's first plans
                await catch_up(url, states, sums, 1, False, compact, Path(tmp))
            for k in args.lags:
                for peers in (False, True):
                    for compact in (True, False):
                        rows.append(await catch_up(url, states, sums, k, peers, compact, Path(tmp)))
            await peer.close()
            await peer_client.__aexit__(None, None, None)
        finally:
            server.kill()
            server.wait()
    return {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
        "params": sum(t.numel() for t in states[0].values()),
        "dense_bf16_bytes": sum(t.numel() for t in states[0].values()) * 2,
        "delta_bytes": deltas,
        "peer_keeps": args.keep,
        "peer_holds": held,
        "rows": rows,
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"Catch-up to version {VERSIONS} ({result['params'] / 1e6:.0f}M bf16 params; load {result['load'][0]:.1f})"
    )
    for col in ("k behind", "source", "plan", "MB", "from peers MB", "from server MB", "s", "paths", "bit-exact"):
        t.add_column(col, justify="right")
    for r in result["rows"]:
        mb = lambda n: f"{n / 1e6:.2f}"  # noqa: E731
        paths = ", ".join(f"{p} {mb(n)}" for p, n in r["paths"].items())
        t.add_row(
            str(r["k"]),
            r["source"],
            r["plan"],
            mb(r["bytes"]),
            mb(r["peer_bytes"]),
            mb(r["server_bytes"]),
            f"{r['catch_up_s']:.3f}",
            paths,
            str(r["bit_exact"]),
        )
    Console(width=160).print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, default=16e6, help="parameters of the synthetic model")
    p.add_argument("--fraction", type=float, default=0.01, help="fraction of elements changed per version")
    p.add_argument("--lags", default="1,5,20", help=f"versions behind (1..{VERSIONS}), comma list")
    p.add_argument("--keep", type=int, default=4, help="payloads the peer keeps (the worker's default: 4)")
    p.add_argument("--chunk-bytes", type=int, default=4 << 20, help="weight-server chunk size")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    try:
        args.lags = [int(x) for x in args.lags.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lags {args.lags!r}: give a comma list of integers")
    if not args.lags or any(not 1 <= k <= VERSIONS for k in args.lags):
        p.error(f"--lags {args.lags}: each between 1 and {VERSIONS}")
    result = asyncio.run(bench(args))
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
