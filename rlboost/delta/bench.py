"""Delta codec benchmark on synthetic RL-like updates: size per changed element, encode/apply speed.

fp32 master weights ~ N(0, 0.02) take Adam steps (random gradients, lr 1e-6 by default) and are
published as bf16 after every step; the delta between two consecutive published versions is
what a trainer ships. Throughput is reported in GB/s of dense bf16 weights scanned (the size
of the published tensors divided by the wall time), the best of `--repeat` runs. `--tensors N`
splits the elements over N equal tensors (a model is many tensors; the codec works on two at a
time). `--profile` prints the time of each codec stage (wall and thread CPU time, which a loaded
machine inflates less) next to a plain copy and an xxh3 pass over the same bytes, with the load
average: on a shared machine compare figures to the copy measured at the same time.

    rlboost delta bench [--json] [--elements N] [--tensors 1] [--lr 1e-6] [--profile]
    python bench/delta_bench.py [same flags]            (same thing)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def rl_like_pair(elements: int, lr: float, warmup_steps: int = 5, seed: int = 0) -> tuple[Any, Any]:
    """Two consecutive bf16 publications of fp32 master weights trained by Adam on random gradients."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(elements, generator=gen) * 0.02
    m, v = torch.zeros(elements), torch.zeros(elements)
    old = None
    for t in range(1, warmup_steps + 2):
        g = torch.randn(elements, generator=gen)
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        step = (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt_().add_(1e-8))
        w.add_(step, alpha=-lr)
        if t == warmup_steps:
            old = w.to(torch.bfloat16)
    return old, w.to(torch.bfloat16)


def _best(fn, repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _split(t: Any, tensors: int) -> dict[str, Any]:
    return {f"w{i}": part.clone() for i, part in enumerate(t.chunk(tensors))}


def run(elements: int = 50_000_000, lr: float = 1e-6, repeat: int = 3, tensors: int = 1) -> dict[str, Any]:
    """Measure the codec on one RL-like step; returns the figures `rlboost delta bench --json` prints."""
    import torch

    import rlboost.delta as rd

    old, new = rl_like_pair(elements, lr)
    base, target = _split(old, tensors), _split(new, tensors)
    rd.encode({"w": old[:4096]}, {"w": new[:4096]}, base_version=0, version=1)  # warm the JIT, not timed
    enc_s, blob = _best(lambda: rd.encode(base, target, base_version=0, version=1), repeat)
    info = rd.inspect(blob)
    work = {k: v.clone() for k, v in base.items()}

    def apply_once() -> float:
        for k, v in work.items():
            v.copy_(base[k])  # reset outside the timed region
        t0 = time.perf_counter()
        rd.apply_(work, blob)
        return time.perf_counter() - t0

    app_s = min(apply_once() for _ in range(repeat))
    bit_exact = all(torch.equal(work[k].view(torch.int16), target[k].view(torch.int16)) for k in target)
    scanned = new.numel() * new.element_size()
    return {
        "changed_fraction": round(info.changed_fraction, 6),
        "bytes_per_changed_element": round(len(blob) / max(info.changed, 1), 4),
        "encode_gb_per_s": round(scanned / enc_s / 1e9, 3),
        "apply_gb_per_s": round(scanned / app_s / 1e9, 3),
        "bit_exact": bit_exact,
    }


def _stage(fn, repeat: int, reset=None) -> tuple[float, float]:
    """Best wall and best thread-CPU seconds of fn over `repeat` runs (reset runs untimed before each)."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        if reset is not None:
            reset()
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu, wall = min(cpu, time.thread_time() - c0), min(wall, time.perf_counter() - w0)
    return wall, cpu


def profile(elements: int = 50_000_000, lr: float = 1e-6, repeat: int = 3) -> list[dict[str, Any]]:
    """Per-stage times of encoding and applying one bf16 tensor, next to a copy and an xxh3 pass."""
    import os

    import numpy as np
    import torch
    import xxhash

    import rlboost.delta as rd
    from rlboost.delta import _scan, codec, format

    old, new = rl_like_pair(elements, lr)
    o, n = old.view(torch.int16).numpy().view(np.uint16), new.view(torch.int16).numpy().view(np.uint16)
    rd.encode({"w": old[:4096]}, {"w": new[:4096]}, base_version=0, version=1)  # warm the JIT
    blob = rd.encode({"w": old}, {"w": new}, base_version=0, version=1)
    scan = _scan.scan_pair(o, n, o.size // 4)
    planes, _ = _scan.byte_planes(scan.idx, scan.diff)
    delta = format.parse(blob)
    entry = delta.tensors[0]
    idx, diff = codec.decode_sparse(entry, delta.payload_of(entry))
    dst, work = np.empty_like(o), o.copy()
    wt = torch.from_numpy(work.view(np.int16)).view(torch.bfloat16)

    def reset() -> None:
        work[:] = o

    stages = {
        "reference: numpy copy": (lambda: np.copyto(dst, o), None),
        "reference: xxh3 of one tensor": (lambda: xxhash.xxh3_64_intdigest(o), None),
        "encode: scan + xxh3 of base and new (one pass)": (lambda: _scan.scan_pair(o, n, o.size // 4), None),
        "encode: byte planes (gaps, zigzag)": (lambda: _scan.byte_planes(scan.idx, scan.diff), None),
        "encode: zstd of the planes (2 threads)": (lambda: codec._pmap(codec._compress, list(planes)), None),
        "encode: total": (lambda: rd.encode({"w": old}, {"w": new}, base_version=0, version=1), None),
        "apply: parse + payload checksum": (lambda: format.checksum(format.parse(blob).payload), None),
        "apply: decode (zstd 2 threads, planes, bounds)": (
            lambda: codec.decode_sparse(entry, delta.payload_of(entry)),
            None,
        ),
        "apply: write + xxh3 of target (one pass)": (lambda: _scan.write_and_hash(work, idx, diff), reset),
        "apply: write only (verify_target=False)": (lambda: _scan.write(work, idx, diff), reset),
        "apply: total": (lambda: rd.apply_({"w": wt}, blob), reset),
    }
    rows = []
    for name, (fn, rst) in stages.items():
        wall, cpu = _stage(fn, repeat, rst)
        rows.append(
            {
                "stage": name,
                "wall_ms": round(wall * 1e3, 2),
                "thread_cpu_ms": round(cpu * 1e3, 2),
                "gb_per_s_wall": round(o.nbytes / wall / 1e9, 2),
                "load_average_1m": round(os.getloadavg()[0], 2),
            }
        )
    return rows


def print_table(result: dict[str, Any], elements: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rlboost delta bench ({elements:,} bf16 elements, one RL-like step)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("goal", justify="right")
    goals = {"bytes_per_changed_element": "<= 1.5", "encode_gb_per_s": ">= 2", "apply_gb_per_s": ">= 5"}
    for key, value in result.items():
        table.add_row(key, str(value), goals.get(key, ""))
    Console().print(table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--elements", type=int, default=50_000_000, help="bf16 elements (default 50M = 100 MB)")
    parser.add_argument("--lr", type=float, default=1e-6, help="Adam learning rate of the synthetic step")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions; the best is reported")
    parser.add_argument("--tensors", type=int, default=1, help="split the elements over this many equal tensors")
    parser.add_argument("--profile", action="store_true", help="time each codec stage (one tensor) instead")


def main(args: argparse.Namespace) -> int:
    if args.elements < 1 or args.repeat < 1 or not 1 <= args.tensors <= args.elements:
        print(
            "error: --elements, --repeat and --tensors must be positive (and --tensors <= --elements)", file=sys.stderr
        )
        return 2
    if args.profile:
        rows = profile(args.elements, args.lr, args.repeat)
        print(json.dumps(rows) if args.json else "\n".join(json.dumps(r) for r in rows))
        return 0
    result = run(args.elements, args.lr, args.repeat, args.tensors)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result, args.elements)
    return 0
