"""Weight sync over a shaped link: delta vs full sync, one stream vs several, for a >=100M-parameter model.

    .venv/bin/python bench/weight_sync_bench.py                 # rich table
    .venv/bin/python bench/weight_sync_bench.py --json          # one JSON object on stdout
    .venv/bin/python bench/weight_sync_bench.py --params 50e6 --links 125 --streams 1,4

A synthetic bf16 state (default 128M parameters in 8 tensors) moves from version 0 to 1 with RL-like
changes (about 1% of elements nudged by a few bf16 ulps, as Adam steps at lr ~1e-6 do after rounding).
Two real weight-server processes hold it: one as the trainer publishes in `delta` mode (v0 full, v1 a
sparse delta), one in `full` mode (v0, v1 full snapshots). Every pull goes through a TCP proxy process
that shapes the link: a bandwidth shared by all connections (token bucket per direction, e.g. 50 MB/s or
125 MB/s = 1 Gbit/s) plus a one-way delay per segment. The pulls are the rollout-worker's real path
(rollout_worker.weights.WeightPuller: sync plan, ranged chunks over N streams, in-place apply, whole-state
checksum verified). Scenarios: a worker at v0 syncing to v1, and a new worker syncing from nothing to v1.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "services" / "rollout-worker", ROOT / "services" / "weight-server"):
    sys.path.insert(0, str(extra))

TOKEN = "bench-token"
MB = 1_000_000


# ---- the shaped link (runs in its own process: `--proxy LISTEN UPSTREAM MBPS DELAY_MS`) --------------------
BURST_S = 0.02  # link time a bucket may owe: pays back the event loop's oversleeps (see Bucket.take)


class Bucket:
    """A link's bandwidth in one direction, shared by every connection (virtual-clock token bucket)."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate, self.free_at = bytes_per_s, 0.0

    async def take(self, n: int) -> None:
        now = time.monotonic()
        # The clock restarts at most BURST_S in the past: asyncio's sleeps overshoot by ~1 ms, as long as a 64 KB
        # piece takes at 125 MB/s, and a clock restarted at `now` lost every overshoot for good (one stream got
        # 28 of 50 MB/s, 52 of 125). Over any window the link still carries at most rate x (window + BURST_S).
        self.free_at = max(now - BURST_S, self.free_at) + n / self.rate
        if self.free_at > now:
            await asyncio.sleep(self.free_at - now)  # shaping: the bytes leave when the link has carried them


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, bucket: Bucket, delay: float) -> None:
    """Forward bytes through the bucket, each segment delivered `delay` seconds after it was sent."""
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

    async def deliver() -> None:
        while (item := await queue.get()) is not None:
            due, data = item
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # propagation delay of the modelled link
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(deliver())
    try:
        while data := await reader.read(64 << 10):
            await bucket.take(len(data))
            queue.put_nowait((time.monotonic() + delay, data))
        queue.put_nowait(None)
        await sender
    except (ConnectionError, asyncio.CancelledError):
        sender.cancel()
    finally:
        writer.close()


async def run_proxy(listen: int, upstream: int, mbps: float, delay_ms: float) -> None:
    down, up, delay = Bucket(mbps * MB), Bucket(mbps * MB), delay_ms / 1000

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(_pipe(cr, uw, up, delay), _pipe(ur, cw, down, delay), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


# ---- the model and its versions ---------------------------------------------------------------------------
def make_states(params: int, fraction: float, tensors: int = 8, seed: int = 0):
    """(v0, v1) bf16 states: v1 has ~`fraction` of elements moved by 1-3 ulps (bit patterns +-1..3)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    per = params // tensors // 1024 * 1024  # rows of 1024
    v0, v1 = {}, {}
    for i in range(tensors):
        t = (torch.randn(per, generator=g) * 0.02).to(torch.bfloat16).reshape(-1, 1024)
        new = t.clone()
        flat = new.view(-1).view(torch.int16)
        idx = torch.randint(0, per, (int(per * fraction),), generator=g)
        flat[idx] += torch.randint(1, 4, (idx.numel(),), generator=g, dtype=torch.int16) * (
            torch.randint(0, 2, (idx.numel(),), generator=g, dtype=torch.int16) * 2 - 1
        )
        v0[f"layers.{i}.weight"], v1[f"layers.{i}.weight"] = t, new
    return v0, v1


def spawn_server(data_dir: Path, port: int, chunk: int, log: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "RLBOOST_TOKEN": TOKEN, "PYTHONPATH": f"{ROOT}:{ROOT / 'services' / 'weight-server'}"}
    argv = [
        sys.executable,
        "-m",
        "weight_server",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--chunk-bytes",
        str(chunk),
        "--no-nats",
        "--log-level",
        "WARNING",
    ]
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(argv, env=env, stdout=out, stderr=out)


def spawn_proxy(listen: int, upstream: int, mbps: float, delay_ms: float) -> subprocess.Popen:
    argv = [sys.executable, __file__, "--proxy", str(listen), str(upstream), str(mbps), str(delay_ms)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def publish(url: str, v0, v1, mode: str) -> dict[str, int]:
    import rlboost.delta as rd
    from rlboost.weights.checksum import state_checksum
    from rlboost.weights.client import WeightClient
    from rlboost.weights.safetensors_io import state_to_bytes

    async with WeightClient(url, token=TOKEN) as wc:
        await wc.upload(0, state_to_bytes(v0), kind="full", checksum=state_checksum(v0))
        if mode == "delta":
            t0 = time.monotonic()
            payload = rd.encode(v0, v1, base_version=0, version=1)
            encode_s = time.monotonic() - t0
            await wc.upload(1, payload, kind="delta", checksum=state_checksum(v1), base_version=0, fmt="rlboost-delta")
            return {"v1_bytes": len(payload), "encode_ms": round(encode_s * 1000)}
        payload = state_to_bytes(v1)
        await wc.upload(1, payload, kind="full", checksum=state_checksum(v1))
        return {"v1_bytes": len(payload)}


async def sync_once(url: str, streams: int, held_v0, checksum_v0: str) -> dict:
    """One worker's pull of version 1 through the shaped link, from v0 (held_v0 given) or from nothing."""
    from rlboost.weights.client import WeightClient
    from rollout_worker.weights import PulledWeights, WeightPuller

    async with WeightClient(url, streams=streams, timeout=300) as wc:
        puller = WeightPuller(wc)
        if held_v0 is not None:
            puller.held = PulledWeights(0, {k: t.clone() for k, t in held_v0.items()}, checksum_v0, 0, 0.0)
        t0 = time.monotonic()
        pulled = await puller.pull(1)
        return {
            "seconds": time.monotonic() - t0,
            "bytes": pulled.nbytes,
            "paths": pulled.paths,
            "checksum": pulled.checksum,
            "fallback": pulled.fallback,
        }


async def bench(args: argparse.Namespace) -> dict:
    from rlboost.nats_server import free_port, wait_for_port
    from rlboost.weights.checksum import state_checksum

    v0, v1 = make_states(int(args.params), args.fraction)
    n_params = sum(t.numel() for t in v0.values())
    sums = (state_checksum(v0), state_checksum(v1))
    procs: list[subprocess.Popen] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlboost-syncbench-") as tmp:
        try:
            ports = {m: free_port() for m in ("delta", "full")}
            for mode, port in ports.items():
                procs.append(spawn_server(Path(tmp) / mode, port, args.chunk_bytes))
                wait_for_port("127.0.0.1", port, 60)
            published = {m: await publish(f"http://127.0.0.1:{p}", v0, v1, m) for m, p in ports.items()}
            for mbps in args.links:
                proxies = {m: free_port() for m in ports}
                link = [spawn_proxy(proxies[m], ports[m], mbps, args.delay_ms) for m in ports]
                procs += link
                for p in proxies.values():
                    wait_for_port("127.0.0.1", p, 30)
                for streams in args.streams:
                    for scenario, held in (("v -> v+1", v0), ("new -> v+1", None)):
                        for mode in ("delta", "full"):
                            url = f"http://127.0.0.1:{proxies[mode]}"
                            r = await sync_once(url, streams, held, sums[0])
                            rows.append(
                                {
                                    "link_mb_per_s": mbps,
                                    "delay_ms": args.delay_ms,
                                    "streams": streams,
                                    "scenario": scenario,
                                    "mode": mode,
                                    "seconds": round(r["seconds"], 3),
                                    "bytes": r["bytes"],
                                    "paths": r["paths"],
                                    "bit_exact": r["checksum"] == sums[1] and not r["fallback"],
                                }
                            )
                for p in link:
                    p.kill()
                    p.wait()
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        },
        "params": n_params,
        "changed_fraction": args.fraction,
        "dense_bf16_bytes": n_params * 2,
        "chunk_bytes": args.chunk_bytes,
        "published": published,
        "rows": rows,
    }


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(width=max(120, Console().width))
    m = result["machine"]
    c.print(
        f"[bold]weight sync[/]: {result['params'] / 1e6:.0f}M bf16 params "
        f"({result['dense_bf16_bytes'] / MB:.0f} MB), {result['changed_fraction']:.1%} changed; "
        f"delta v1 = {result['published']['delta']['v1_bytes'] / MB:.2f} MB "
        f"(encoded in {result['published']['delta']['encode_ms']} ms)"
    )
    c.print(f"{m['date']}  {m['platform']}  cpus={m['cpus']}  load={m['loadavg']}")
    t = Table("link", "streams", "scenario", "mode", "MB moved", "seconds", "speed-up", "bit-exact")
    by_key = {(r["link_mb_per_s"], r["streams"], r["scenario"], r["mode"]): r for r in result["rows"]}
    for r in result["rows"]:
        full = by_key[(r["link_mb_per_s"], r["streams"], r["scenario"], "full")]
        speed = f"{full['seconds'] / r['seconds']:.1f}x" if r["mode"] == "delta" else ""
        link = f"{r['link_mb_per_s']:g} MB/s +{r['delay_ms']:g} ms"
        t.add_row(
            link,
            str(r["streams"]),
            r["scenario"],
            r["mode"],
            f"{r['bytes'] / MB:.2f}",
            f"{r['seconds']:.2f}",
            speed,
            "yes" if r["bit_exact"] else "[red]NO[/]",
        )
    c.print(t)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=128e6, help="parameters of the synthetic model (>= 100M)")
    p.add_argument("--fraction", type=float, default=0.01, help="fraction of elements changed per step")
    p.add_argument(
        "--links",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[50.0, 125.0],
        help="link bandwidths in MB/s, comma-separated (125 = 1 Gbit/s)",
    )
    p.add_argument("--delay-ms", type=float, default=10.0, help="one-way delay added per segment")
    p.add_argument(
        "--streams",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4],
        help="concurrent ranged streams per pull, comma-separated",
    )
    p.add_argument("--chunk-bytes", type=int, default=4 << 20, help="weight-server chunk size")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--proxy", nargs=4, metavar=("LISTEN", "UPSTREAM", "MBPS", "DELAY_MS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.proxy:
        listen, upstream, mbps, delay = args.proxy
        asyncio.run(run_proxy(int(listen), int(upstream), float(mbps), float(delay)))
        return 0
    import logging

    logging.disable(logging.INFO)  # the puller's per-pull log lines would interleave with the table
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0 if all(r["bit_exact"] for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
