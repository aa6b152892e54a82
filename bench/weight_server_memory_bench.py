"""Weight-server memory under valid compacted-delta reads (issue 31 item 6: the audit saw 69 -> 209 MB).

    .venv/bin/python bench/weight_server_memory_bench.py            # one JSON object on stdout
    .venv/bin/python bench/weight_server_memory_bench.py --params 20e6 --versions 12 --readers 8

A real `python -m weight_server` process holds a synthetic bf16 state (v0 a snapshot) and a chain of sparse
deltas (about 1% of elements moved per version, as RL steps do). Then `--readers` clients at once ask a sync plan
from every version a to every later b two or more apart (each a compacted delta a->b, built on first request) and
read every payload of the plan whole, over HTTP with the worker's path (GET /v1/sync, ranged payload reads). The
server's resident memory (VmRSS) is read from /proc before the reads, after them, and its peak (VmHWM); the figures
go to docs/benchmarks.md with the machine, date and load.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "services" / "weight-server"):
    sys.path.insert(0, str(extra))

from bench.weight_sync_bench import TOKEN, make_states, spawn_server  # noqa: E402

MB = 1_000_000


def rss_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak) of `pid`, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {k: round(int(fields[k].split()[0]) * 1024 / MB, 1) for k in ("VmRSS", "VmHWM")}


def chain(params: int, versions: int):
    """States v0..v(n-1): each with ~1% of elements moved by 1-3 bf16 ulps from the one before."""
    import torch

    states = [make_states(params, 0.01, seed=0)[0]]
    for v in range(1, versions):
        g = torch.Generator().manual_seed(v)
        nxt = {}
        for name, t in states[-1].items():
            new = t.clone()
            flat = new.view(-1).view(torch.int16)
            idx = torch.randint(0, flat.numel(), (flat.numel() // 100,), generator=g)
            flat[idx] += torch.randint(1, 4, (idx.numel(),), generator=g, dtype=torch.int16)
            nxt[name] = new
        states.append(nxt)
    return states


async def publish(url: str, states) -> int:
    import rlboost.delta as rd
    from rlboost.weights.checksum import state_checksum
    from rlboost.weights.client import WeightClient
    from rlboost.weights.safetensors_io import state_to_bytes

    total = 0
    async with WeightClient(url, token=TOKEN) as wc:
        await wc.upload(0, state_to_bytes(states[0]), kind="full", checksum=state_checksum(states[0]))
        for v in range(1, len(states)):
            payload = rd.encode(states[v - 1], states[v], base_version=v - 1, version=v)
            total += len(payload)
            await wc.upload(v, payload, "delta", state_checksum(states[v]), base_version=v - 1, fmt="rlboost-delta")
    return total


async def read_all(url: str, pairs: list[tuple[int, int]], readers: int) -> int:
    """Every pair's sync plan and each payload of it read whole, `readers` at a time; bytes read."""
    import httpx

    from rlboost.wire import weight_routes as routes
    from rlboost.wire.weights_io import Manifest

    headers = {"Authorization": f"Bearer {TOKEN}"}
    queue: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    for pair in pairs:
        queue.put_nowait(pair)
    read = 0

    async def reader(client: httpx.AsyncClient) -> None:
        nonlocal read
        while not queue.empty():
            a, b = queue.get_nowait()
            plan = (await client.get("/v1/sync", params={"from": a, "to": b})).raise_for_status().json()
            for m in map(Manifest.model_validate, plan):
                async with client.stream("GET", routes.api(m.payload_path)) as r:
                    async for block in r.aiter_bytes(1 << 20):
                        read += len(block)

    # a connection per request: a pooled one idle past the server's deadline may be closed as it is reused
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        await asyncio.gather(*(reader(client) for _ in range(readers)))
    return read


async def bench(args: argparse.Namespace) -> dict:
    from rlboost.nats_server import free_port, wait_for_port

    states = chain(int(args.params), args.versions)
    with tempfile.TemporaryDirectory(prefix="ws-mem-") as tmp:
        port = free_port()
        proc = spawn_server(Path(tmp) / "data", port, 4 << 20, log=Path(args.server_log) if args.server_log else None)
        try:
            wait_for_port("127.0.0.1", port, 60, proc)
            url = f"http://127.0.0.1:{port}"
            delta_bytes = await publish(url, states)
            del states
            before = rss_mb(proc.pid)
            pairs = [(a, b) for a in range(args.versions) for b in range(a + 2, args.versions)]
            start = time.monotonic()
            read = 0
            for _ in range(args.rounds):
                read += await read_all(url, pairs, args.readers)
            seconds = time.monotonic() - start
            after = rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    return {
        "bench": "weight_server_memory",
        "params": int(args.params),
        "versions": args.versions,
        "delta_mb": round(delta_bytes / MB, 1),
        "pairs": len(pairs),
        "rounds": args.rounds,
        "readers": args.readers,
        "read_mb": round(read / MB, 1),
        "seconds": round(seconds, 1),
        "rss_before_mb": before["VmRSS"],
        "rss_after_mb": after["VmRSS"],
        "rss_peak_mb": after["VmHWM"],
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "load": [round(x, 1) for x in os.getloadavg()],
        "date": datetime.date.today().isoformat(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=20e6, help="bf16 parameters of the state (default 20M: 40 MB)")
    p.add_argument("--versions", type=int, default=12, help="versions: v0 a snapshot, then deltas")
    p.add_argument("--readers", type=int, default=8, help="clients reading at once")
    p.add_argument("--rounds", type=int, default=3, help="times every pair is read")
    p.add_argument("--server-log", default="", help="file for the weight-server's log (default: discarded)")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(bench(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
