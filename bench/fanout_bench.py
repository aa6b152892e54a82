"""Peer weight fan-out figures: a wave of new workers reaching the current version, through peers vs from the server.

    sudo .venv/bin/python bench/fanout_bench.py --workers 16 --regions 2 --json out.json

One weight-server and N weights-client processes (bench/fanout_node.py: a worker's weight path without the engine),
each in its own network namespace on a veth link shaped with tc (tbf, --node-mbit each way); each region is a
bridge, and region r > 0 reaches region 0 (the weight-server's) over one veth pair shaped with netem (--region-mbit,
--region-delay-ms each way). Needs root (`ip netns`, `tc`); everything lives in a private 10.77.0.0/16 on this
machine and is removed at the end.

Writes {"workers", "regions", "payload_bytes", "wave_seconds", "ideal_seconds", "server_egress_bytes_per_version",
"cross_region_bytes_per_version", "bitexact", "pulled_bytes_per_cpu_s", "served_bytes_per_cpu_s" (a peer's serving),
"server_served_bytes_per_cpu_s" (the weight-server's), "processes" (each one's CPU seconds over the wave, user and
kernel, from /proc/<pid>/stat, beside the bytes it pulled and served)} plus the same wave pulled from the weight-server only ("baseline"), the
per-node link, and "ideal_seconds_with_region_link": the ideal when the region link, not a node's, is the narrowest.
ideal_seconds = payload / node link + per-hop latency x log2(N) (the issue's formula).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "services/weight-server")]
PREFIX = "fob"
TOKEN = "fanout-bench-token"
PORT = 8600


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def ns(name: str, *cmd: str) -> None:
    sh("ip", "netns", "exec", name, *cmd)


def shape(dev: str, mbit: float, netns: str | None = None, delay_ms: float = 0) -> bool:
    """Egress of `dev` at `mbit`: netem with the delay when asked for one and the kernel has it (sch_netem), else
    tbf (rate only). Returns whether the delay is emulated."""
    tbf = ["tbf", "rate", f"{mbit}mbit", "burst", "64kb", "latency", "50ms"]
    netem = ["netem", "delay", f"{delay_ms}ms", "rate", f"{mbit}mbit", "limit", "100000"]
    for qdisc in [netem, tbf] if delay_ms else [tbf]:
        cmd = ["tc", "qdisc", "replace", "dev", dev, "root", *qdisc]
        try:
            ns(netns, *cmd) if netns else sh(*cmd)
            return qdisc is netem
        except subprocess.CalledProcessError:
            if qdisc is tbf:
                raise
    return False


class Sandbox:
    """The namespaces, bridges and links of one bench run; `close` removes them all."""

    def __init__(self, regions: int, node_mbit: float, region_mbit: float, region_delay_ms: float) -> None:
        self.regions, self.node_mbit = regions, node_mbit
        self.region_mbit, self.region_delay_ms = region_mbit, region_delay_ms
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.region_links: list[str] = []
        self.delay_emulated = regions > 1

    def build(self) -> None:
        for r in range(self.regions):
            br = f"{PREFIX}br{r}"
            sh("ip", "link", "add", br, "type", "bridge")
            self.links.append(br)
            sh("ip", "link", "set", br, "up")
        sh("ip", "addr", "add", "10.77.255.254/16", "dev", f"{PREFIX}br0")  # the bench itself uploads from here
        for r in range(1, self.regions):  # region r <-> region 0 over one shaped, delayed link
            a, b = f"{PREFIX}x{r}a", f"{PREFIX}x{r}b"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            self.links.append(a)
            self.region_links.append(a)
            sh("ip", "link", "set", a, "master", f"{PREFIX}br0", "up")
            sh("ip", "link", "set", b, "master", f"{PREFIX}br{r}", "up")
            for dev in (a, b):
                self.delay_emulated &= shape(dev, self.region_mbit, delay_ms=self.region_delay_ms)

    def node(self, index: int, region: int) -> str:
        """A namespace at 10.77.<index // 250>.<index % 250 + 1> on region's bridge; returns its address."""
        name, host_dev = f"{PREFIX}n{index}", f"{PREFIX}h{index}"
        addr = f"10.77.{index // 250}.{index % 250 + 1}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "link", "add", host_dev, "type", "veth", "peer", "name", "eth0", "netns", name)
        self.links.append(host_dev)
        sh("ip", "link", "set", host_dev, "master", f"{PREFIX}br{region}", "up")
        ns(name, "ip", "addr", "add", f"{addr}/16", "dev", "eth0")
        ns(name, "ip", "link", "set", "eth0", "up")
        ns(name, "ip", "link", "set", "lo", "up")
        shape(host_dev, self.node_mbit)  # towards the node
        shape("eth0", self.node_mbit, netns=name)  # from the node
        return addr

    def cross_region_bytes(self) -> int:
        total = 0
        for dev in self.region_links:
            for d in ("tx_bytes", "rx_bytes"):
                total += int(Path(f"/sys/class/net/{dev}/statistics/{d}").read_text())
        return total

    def close(self) -> None:
        for name in self.namespaces:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        for dev in self.links:
            subprocess.run(["ip", "link", "del", dev], capture_output=True)


def server_egress(url: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith("rlboost_weights_bytes_served_total{"))


def start_server(box: Sandbox, work: Path, chunk_bytes: int) -> tuple[subprocess.Popen, str]:
    addr = box.node(999, 0)
    (work / "token").write_text(TOKEN)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'services/weight-server'}"}
    cmd = [
        "ip",
        "netns",
        "exec",
        f"{PREFIX}n999",
        sys.executable,
        "-m",
        "weight_server",
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--data-dir",
        str(work / "data"),
        "--token-file",
        str(work / "token"),
        "--no-nats",
        "--chunk-bytes",
        str(chunk_bytes),
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://{addr}:{PORT}"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(Exception):
            server_egress(url)
            return proc, url
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"fanout_bench: the weight-server did not start: {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)  # polling a starting process' port


async def upload(url: str, payload: bytes) -> None:
    from rlboost.weights.client import WeightClient

    async with WeightClient(url, token=TOKEN) as wc:
        await wc.upload(0, payload, checksum="bench")


def spawn_nodes(box: Sandbox, url: str, n: int, peers: bool, first_index: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(n):
        region = i % box.regions
        index = first_index + i
        addr = box.node(index, region)
        cmd = [
            "ip",
            "netns",
            "exec",
            f"{PREFIX}n{index}",
            sys.executable,
            str(ROOT / "bench/fanout_node.py"),
            "--server",
            url,
            "--worker",
            f"w{index}",
            "--region",
            f"r{region}",
            "--zone",
            f"r{region}a",
            "--host",
            "0.0.0.0",
            "--advertise",
            addr,
            "--token",
            TOKEN,
            *([] if peers else ["--no-peers"]),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    return procs


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process (`ip netns exec` execs the command: the Popen's pid is the Python process). The
    kernel's side includes the emulated network (bridges, tc, netfilter), charged to whichever process it runs in."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def events(proc: subprocess.Popen, until: str) -> dict:
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == until:
            return event
    raise SystemExit(f"fanout_bench: a node exited before '{until}' (rc {proc.wait()})")


def final_stats(proc: subprocess.Popen) -> dict:
    """A node's payload bytes served so far (it keeps serving after its own pull is done) and the sha256 of the
    whole payload it pulled (every node's, checked against the uploaded payload's: "bitexact")."""
    proc.stdin.write("stats\n")
    proc.stdin.flush()
    return events(proc, "stats")


def per_process(cpu: list[tuple[float, float]], server_served: float, done: list[dict], served: list[int], go: float):
    """Each process' CPU seconds over the wave beside the payload bytes it pulled and served: the weight-server
    first (it only serves), then the nodes (each pulls one payload; relays and chain links serve one on), with when
    each node's pull started and ended (seconds after the release) and how many of its bytes came from peers."""
    rows: list[dict] = [{"role": "weight-server", "pulled_bytes": 0, "served_bytes": int(server_served)}]
    rows += [
        {
            "role": "node",
            "pulled_bytes": d["bytes"],
            "served_bytes": b,
            "peer_bytes": d["peer_bytes"],
            "start_s": round(d["t_start"] - go, 3),
            "done_s": round(d["t_done"] - go, 3),
        }
        for d, b in zip(done, served, strict=True)
    ]
    for row, (user, kernel) in zip(rows, cpu, strict=True):
        row.update(user_cpu_s=round(user, 3), kernel_cpu_s=round(kernel, 3), cpu_s=round(user + kernel, 3))
    return rows


def profile(pids: list[int], directory: str, label: str) -> list[subprocess.Popen]:
    """`perf record` of the weight-server and every node during the wave: on-CPU samples only (a sampling profiler of
    Python stacks counts a thread waiting on its queue as much as one working), kernel and native frames included,
    so copies, hashing and syscalls show by name. `perf report -i DIR/LABEL.data --no-children --sort dso,sym`."""
    if not directory:
        return []
    Path(directory).mkdir(parents=True, exist_ok=True)
    cmd = ["perf", "record", "-F", "499", "-g", "-o", f"{directory}/{label}.data", "-p", ",".join(map(str, pids))]
    spy = str(Path(sys.executable).with_name("py-spy"))
    # and py-spy (PyPI) on the server and the first two nodes (the regions' relays), sampling only a thread that holds
    # the GIL: which Python code the interpreter's share of the CPU is spent in (collapsed stacks)
    spies = [
        [spy, "record", "--gil", "-r", "200", "-f", "raw", "-o", f"{directory}/{label}-{i}.txt", "-p", str(pid)]
        for i, pid in enumerate(pids[:3])
    ]
    return [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for c in [cmd, *spies]]


def wave(box: Sandbox, url: str, server_pid: int, n: int, peers: bool, first_index: int, profile_dir: str = "") -> dict:
    """Start n nodes, let them register, release them at once; the wave ends when the last one is done. CPU: every
    node's and the weight-server's own CPU seconds between the release and the wave's end (the nodes' closing
    sha256 of the whole payload, the bench's bit-exactness check, is asked for after the CPU reading)."""
    procs = spawn_nodes(box, url, n, peers, first_index)
    try:
        for p in procs:
            events(p, "ready")
        egress0, cross0 = server_egress(url), box.cross_region_bytes()
        pids = [server_pid, *(p.pid for p in procs)]
        spies = profile(pids, profile_dir, "peers" if peers else "server-only")
        cpu0 = [cpu_seconds(pid) for pid in pids]
        go = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        done = [events(p, "done") for p in procs]
        cpu = [(u - u0, k - k0) for (u, k), (u0, k0) in zip(map(cpu_seconds, pids), cpu0, strict=True)]
        stats = [final_stats(p) for p in procs]  # after the CPU reading: the sha256 is the bench's check
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # perf and py-spy write their profiles on SIGINT
            spy.wait(30)
        server_served = server_egress(url) - egress0
        return {
            "processes": per_process(cpu, server_served, done, [st["served_bytes"] for st in stats], go),
            "cpu_seconds": sum(u + k for u, k in cpu),
            "user_cpu_seconds": sum(u for u, _ in cpu),
            "server_cpu_seconds": sum(cpu[0]),
            "wave_seconds": max(d["t_done"] for d in done) - go,
            "server_egress_bytes": server_egress(url) - egress0,
            "cross_region_bytes": box.cross_region_bytes() - cross0,
            "sha256": {st["sha256"] for st in stats},
            "peer_failures": sum(d["peer_failures"] for d in done),
        }
    finally:
        for p in procs:
            with contextlib.suppress(Exception):
                p.stdin.close()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--json", default="")
    p.add_argument("--payload-mb", type=float, default=16)
    p.add_argument("--chunk-kb", type=int, default=256)
    p.add_argument("--node-mbit", type=float, default=200, help="each node's link, each way")
    p.add_argument("--region-mbit", type=float, default=100, help="the link between two regions, each way")
    p.add_argument("--region-delay-ms", type=float, default=20, help="one-way delay between regions (RTT x2)")
    p.add_argument("--no-baseline", action="store_true", help="skip the everyone-from-the-server wave")
    p.add_argument("--profile", default="", help="write perf profiles of the wave (server and nodes) into this folder")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("fanout_bench: needs root for `ip netns` and `tc` (run it in its own sandbox or VM)")
    if not 1 <= a.regions <= 8 or not 2 <= a.workers <= 240:
        raise SystemExit("fanout_bench: --regions must be 1..8 and --workers 2..240")
    payload = os.urandom(int(a.payload_mb * (1 << 20)))
    box = Sandbox(a.regions, a.node_mbit, a.region_mbit, a.region_delay_ms)
    server = None
    try:
        box.build()
        with tempfile.TemporaryDirectory(prefix="fanout-bench-") as work:
            server, url = start_server(box, Path(work), a.chunk_kb << 10)
            asyncio.run(upload(url, payload))
            fanned = wave(box, url, server.pid, a.workers, True, 0, a.profile)
            base = None if a.no_baseline else wave(box, url, server.pid, a.workers, False, 300, a.profile)
    finally:
        if server is not None:
            server.terminate()
            server.wait(15)
        box.close()
    print(json.dumps(report(a, payload, fanned, base, box.delay_emulated), indent=1))


def report(a: argparse.Namespace, payload: bytes, fanned: dict, base: dict | None, delay_emulated: bool) -> dict:
    size, node_bps = len(payload), a.node_mbit * 1e6 / 8
    hop = 2 * a.region_delay_ms / 1000 if delay_emulated else 0.001  # a round trip across the slowest hop
    out = {
        "workers": a.workers,
        "regions": a.regions,
        "payload_bytes": size,
        "wave_seconds": round(fanned["wave_seconds"], 3),
        "ideal_seconds": round(size / node_bps + hop * math.log2(a.workers), 3),
        "server_egress_bytes_per_version": int(fanned["server_egress_bytes"]),
        "cross_region_bytes_per_version": int(fanned["cross_region_bytes"]),
        "bitexact": fanned["sha256"] == {hashlib.sha256(payload).hexdigest()},
        "ideal_seconds_with_region_link": round(
            size / min(node_bps, a.region_mbit * 1e6 / 8 if a.regions > 1 else node_bps) + hop * math.log2(a.workers), 3
        ),
        "server_egress_bytes_per_new_worker": int(fanned["server_egress_bytes"] / a.workers),
        "peer_failures": fanned["peer_failures"],
        **cpu_figures(fanned, size, a.workers),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "link": {
            "node_mbit": a.node_mbit,
            "region_mbit": a.region_mbit,
            "region_delay_ms": a.region_delay_ms,
            "region_delay_emulated": delay_emulated,
        },
    }
    if base is not None:
        out["baseline"] = {
            "wave_seconds": round(base["wave_seconds"], 3),
            "server_egress_bytes_per_version": int(base["server_egress_bytes"]),
            "cross_region_bytes_per_version": int(base["cross_region_bytes"]),
            "bitexact": base["sha256"] == {hashlib.sha256(payload).hexdigest()},
            **cpu_figures(base, size, a.workers),
        }
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


def cpu_figures(w: dict, size: int, workers: int) -> dict:
    """The wave's CPU cost: seconds of every process, and payload bytes delivered (one payload per new worker) per
    CPU second: the figure the wave's speed follows when the cores, not the links, are the limit. Then per byte
    pulled and per byte served (cost_per_byte), and each process' own seconds and bytes."""
    server, nodes = w["processes"][0], w["processes"][1:]
    pull_s, serve_s = cost_per_byte(nodes)
    return {
        "cpu_seconds": round(w["cpu_seconds"], 2),
        "user_cpu_seconds": round(w["user_cpu_seconds"], 2),
        "server_cpu_seconds": round(w["server_cpu_seconds"], 2),
        "bytes_per_cpu_second": int(size * workers / max(w["cpu_seconds"], 1e-9)),
        "bytes_per_user_cpu_second": int(size * workers / max(w["user_cpu_seconds"], 1e-9)),
        "pulled_bytes_per_cpu_s": int(1 / pull_s) if pull_s > 0 else None,
        "served_bytes_per_cpu_s": int(1 / serve_s) if serve_s > 0 else None,
        "server_served_bytes_per_cpu_s": int(server["served_bytes"] / max(server["cpu_s"], 1e-9)),
        "processes": w["processes"],
    }


def cost_per_byte(nodes: list[dict]) -> tuple[float, float]:
    """(CPU seconds per byte pulled, per byte served) of the nodes: a least-squares fit of each node's CPU seconds
    to the bytes it pulled and the bytes it served (one process does both on one event loop, so its CPU cannot be
    split by looking at it; nodes that served nothing, a chain's last link, pin the pull's cost). Without serving
    (the baseline) the served cost is 0 (unknown): the weight-server's own figure is server_served_bytes_per_cpu_s."""
    pp = sum(n["pulled_bytes"] ** 2 for n in nodes)
    ss = sum(n["served_bytes"] ** 2 for n in nodes)
    ps = sum(n["pulled_bytes"] * n["served_bytes"] for n in nodes)
    pc = sum(n["pulled_bytes"] * n["cpu_s"] for n in nodes)
    sc = sum(n["served_bytes"] * n["cpu_s"] for n in nodes)
    det = pp * ss - ps * ps
    if not ss or abs(det) < 1e-9 * pp * ss:  # nothing served, or served in proportion to pulled everywhere
        return (pc / pp if pp else 0.0), 0.0
    return (pc * ss - sc * ps) / det, (pp * sc - ps * pc) / det


if __name__ == "__main__":
    main()
