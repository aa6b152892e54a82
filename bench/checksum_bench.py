"""Whole-state checksum figures: the former sha256 of every byte vs the per-tensor xxh3 listing (1 and 2 threads),
and the checksum taken from a delta's table after a verified apply (no tensor read).

    .venv/bin/python bench/checksum_bench.py                 # ~200 MB bf16 state, best of 3
    .venv/bin/python bench/checksum_bench.py --mb 1000 --repeat 5

The state is bf16, a model's mix of tensor sizes (a few large matrices, many small vectors). Prints one JSON
line: seconds and GB/s per method, and whether every method agrees with the reference where it must.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def _state(mb: int):
    """~`mb` MB of bf16 tensors: per layer 4 square-ish matrices and 2 vectors, like a small transformer."""
    import torch

    g = torch.Generator().manual_seed(0)
    hidden = 1024
    per_layer = 4 * hidden * hidden * 2 + 2 * hidden * 2  # bytes
    layers = max(1, mb * 1_000_000 // per_layer)
    state = {}
    for i in range(layers):
        for w in ("q", "k", "v", "o"):
            state[f"layers.{i}.{w}.weight"] = torch.randn(hidden, hidden, generator=g).to(torch.bfloat16)
        for n in ("norm1", "norm2"):
            state[f"layers.{i}.{n}.weight"] = torch.randn(hidden, generator=g).to(torch.bfloat16)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="state size in MB (bf16)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per method; the best is reported")
    args = parser.parse_args()

    import torch

    import rlboost.delta as rd
    from rlboost.delta.format import parse
    from rlboost.weights.checksum import delta_state_checksum, legacy_state_checksum, state_checksum

    state = _state(args.mb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    new = {k: v.clone() for k, v in state.items()}
    for t in list(new.values())[::7]:  # a sparse step: ~1% of the elements of every 7th tensor
        flat = t.view(-1)
        flat[::100] = (flat[::100].float() * 1.01).to(torch.bfloat16)
    blob = rd.encode(state, new, base_version=0, version=1)
    held = {k: v.clone() for k, v in state.items()}
    apply_s = timeit.timeit(lambda: rd.apply_(held, blob), number=1)  # verified apply: hashes what it writes

    figures: dict[str, object] = {"state_bytes": nbytes, "tensors": len(state), "repeat": args.repeat}
    runs = {
        "sha256_of_bytes": lambda: legacy_state_checksum(new),
        "xxh3_listing_1_thread": lambda: state_checksum(new, threads=1),
        "xxh3_listing_2_threads": lambda: state_checksum(new, threads=2),
        "from_delta_table": lambda: delta_state_checksum(parse(blob)),
    }
    results = {}
    for name, fn in runs.items():
        results[name] = fn()
        seconds = min(timeit.repeat(fn, number=1, repeat=args.repeat))
        figures[name] = {"seconds": round(seconds, 4), "GB_per_s": round(nbytes / seconds / 1e9, 2)}
    figures["agree"] = (
        results["xxh3_listing_1_thread"]
        == results["xxh3_listing_2_threads"]
        == results["from_delta_table"]
        == state_checksum(held)
    )
    figures["verified_delta_apply_seconds"] = round(apply_s, 4)  # for scale: what the table path rides on
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
