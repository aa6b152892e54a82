"""Delta codec benchmark on synthetic RL-like updates: size per changed element, encode/apply speed.

fp32 master weights ~ N(0, 0.02) take Adam steps (random gradients, lr 1e-6 by default) and are
published as bf16 after every step; the delta between two consecutive published versions is
what a trainer ships. Throughput is reported in GB/s of dense bf16 weights scanned (the size
of the published tensor divided by the wall time), the best of `--repeat` runs.

    rlboost delta bench [--json] [--elements N] [--lr 1e-6]
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


def run(elements: int = 50_000_000, lr: float = 1e-6, repeat: int = 3) -> dict[str, Any]:
    """Measure the codec on one RL-like step; returns the figures `rlboost delta bench --json` prints."""
    import torch

    import rlboost.delta as rd

    old, new = rl_like_pair(elements, lr)
    base, target = {"w": old}, {"w": new}
    rd.encode({"w": old[:4096]}, {"w": new[:4096]}, base_version=0, version=1)  # warm the JIT, not timed
    enc_s, blob = _best(lambda: rd.encode(base, target, base_version=0, version=1), repeat)
    info = rd.inspect(blob)
    work = old.clone()

    def apply_once() -> float:
        work.copy_(old)  # reset outside the timed region
        t0 = time.perf_counter()
        rd.apply_({"w": work}, blob)
        return time.perf_counter() - t0

    app_s = min(apply_once() for _ in range(repeat))
    bit_exact = bool(torch.equal(work.view(torch.int16), new.view(torch.int16)))
    scanned = new.numel() * new.element_size()
    return {
        "changed_fraction": round(info.changed_fraction, 6),
        "bytes_per_changed_element": round(len(blob) / max(info.changed, 1), 4),
        "encode_gb_per_s": round(scanned / enc_s / 1e9, 3),
        "apply_gb_per_s": round(scanned / app_s / 1e9, 3),
        "bit_exact": bit_exact,
    }


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


def main(args: argparse.Namespace) -> int:
    if args.elements < 1 or args.repeat < 1:
        print("error: --elements and --repeat must be positive", file=sys.stderr)
        return 2
    result = run(args.elements, args.lr, args.repeat)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result, args.elements)
    return 0
