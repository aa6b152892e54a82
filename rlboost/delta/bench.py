"""Delta codec benchmark on synthetic or real RL updates: size per changed element, encode/apply speed.

fp32 master weights ~ N(0, 0.02) take Adam steps (random gradients, lr 1e-6 by default) and are
published as bf16 after every step; the delta between two consecutive published versions is
what a trainer ships. Throughput is reported in GB/s of dense bf16 weights scanned (the size
of the published tensors divided by the wall time), the best of `--repeat` runs. `--tensors N`
splits the elements over N equal tensors (a model is many tensors; the codec works on two at a
time). `--profile` prints the time of each codec stage (wall and thread CPU time, which a loaded
machine inflates less) next to a plain copy and an xxh3 pass over the same bytes, with the load
average: on a shared machine compare figures to the copy measured at the same time. Each stage's
label says whether it runs on one thread (the helpers the codec's jobs are made of) or on the
codec's two; the totals are the codec itself (apply on a warm target, reset by a numpy copy).

    rlboost delta bench [--json] [--elements N] [--tensors 1] [--lr 1e-6] [--profile]
    python bench/delta_bench.py [same flags]            (same thing)

`--source real` measures the codec on the trainer's real updates instead: it runs
`python -m trainer.delta_updates` as a subprocess (the trainer's own DeepSpeed engine, fp32 master weights,
Adam at --lr, N GRPO steps on the job's task with sampled rollouts; see that module), which writes the
published bf16 states v0..vN as safetensors, then benches every consecutive pair (the delta a trainer
ships per step) and prints per-pair and aggregate figures, with "source": "real". The core never imports
the trainer: only the subprocess does.

    rlboost delta bench --source real [--steps 3] [--lr 1e-6] [--hidden 384 --layers 4 --heads 6]
                        [--warmup-steps 30] [--spec job.yaml] [--keep DIR] [--json] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PUBLIC_KEYS = ("changed_fraction", "bytes_per_changed_element", "encode_gb_per_s", "apply_gb_per_s", "bit_exact")


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
    old, new = rl_like_pair(elements, lr)
    return _public(measure(_split(old, tensors), _split(new, tensors), repeat))


def measure(base: dict[str, Any], target: dict[str, Any], repeat: int = 3) -> dict[str, Any]:
    """The codec's figures on one pair of states: size per changed element, encode/apply GB/s, bit-exactness.

    Bit-exactness is checked on the raw bits of every tensor, whatever its dtype.
    """

    import rlboost.delta as rd

    warm = next(k for k, t in target.items() if t.is_floating_point())
    rd.encode({"w": base[warm][:4096]}, {"w": target[warm][:4096]}, base_version=0, version=1)  # warm the JIT
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
    bit_exact = all(_bits(work[k]).equal(_bits(target[k])) for k in target) and work.keys() == target.keys()
    scanned = sum(t.numel() * t.element_size() for t in target.values())
    return {
        "changed_fraction": round(info.changed_fraction, 6),
        "bytes_per_changed_element": round(len(blob) / max(info.changed, 1), 4),
        "encode_gb_per_s": round(scanned / enc_s / 1e9, 3),
        "apply_gb_per_s": round(scanned / app_s / 1e9, 3),
        "bit_exact": bit_exact,
        # Totals for aggregating over pairs (popped by callers that print the figures above only).
        "_changed": info.changed,
        "_numel": info.numel,
        "_bytes": len(blob),
        "_scanned": scanned,
        "_encode_s": enc_s,
        "_apply_s": app_s,
    }


def _bits(t: Any) -> Any:
    """A tensor's raw bits as integers of the same width (NaN payloads, -0 compare exactly)."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t


def _stage(fn, repeat: int, reset=None) -> tuple[float, float]:
    """Best wall and best thread-CPU seconds of fn over `repeat` runs (reset runs untimed before each), after one
    untimed run: a kernel compiled on first use (a numba cache written by other code, or none) is not timed."""
    wall, cpu = float("inf"), float("inf")
    for i in range(repeat + 1):
        if reset is not None:
            reset()
        w0, c0 = time.perf_counter(), time.thread_time()
        fn()
        if i:
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
        "encode: scan + xxh3 of base and new (one pass, one thread)": (
            lambda: _scan.scan_pair(o, n, o.size // 4),
            None,
        ),
        "encode: byte planes (gaps, zigzag; one thread)": (lambda: _scan.byte_planes(scan.idx, scan.diff), None),
        "encode: zstd of the planes (2 threads)": (lambda: codec._pmap(codec._compress, list(planes)), None),
        "encode: total (2 threads)": (lambda: rd.encode({"w": old}, {"w": new}, base_version=0, version=1), None),
        "apply: parse + payload checksum (one thread)": (lambda: format.checksum(format.parse(blob).payload), None),
        "apply: decode alone (zstd, planes, bounds; segments on 2 threads)": (
            lambda: codec.decode_sparse(entry, delta.payload_of(entry)),
            None,
        ),
        "apply: write + xxh3 of target (one pass, one thread)": (lambda: _scan.write_and_hash(work, idx, diff), reset),
        "apply: write only (no hash, one thread)": (lambda: _scan.write(work, idx, diff), reset),
        "apply: total (2 threads: each segment decoded, written, hashed)": (lambda: rd.apply_({"w": wt}, blob), reset),
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
    parser.add_argument("--lr", type=float, default=1e-6, help="Adam learning rate (synthetic step or real trainer)")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions; the best is reported")
    parser.add_argument("--tensors", type=int, default=1, help="split the elements over this many equal tensors")
    parser.add_argument("--profile", action="store_true", help="time each codec stage (one tensor) instead")
    real = parser.add_argument_group("real trainer updates (--source real)")
    parser.add_argument(
        "--source",
        choices=("synthetic", "real"),
        default="synthetic",
        help="'synthetic' Adam steps on random gradients (default), or 'real' steps of the trainer's engine",
    )
    real.add_argument("--steps", type=int, default=3, help="real optimizer steps; the N consecutive pairs are benched")
    # Defaults: a ~5M-parameter Qwen3 (15x the local toy) that builds, warms up and trains 3 steps in
    # about 1.5 minutes on this loaded 2-core machine; raise them for bigger figures.
    real.add_argument("--hidden", type=int, default=384, help="model.hiddenSize of the trained model")
    real.add_argument("--layers", type=int, default=4, help="model.numLayers of the trained model")
    real.add_argument("--heads", type=int, default=6, help="model.numHeads of the trained model")
    real.add_argument(
        "--warmup-steps",
        type=int,
        default=30,
        help="supervised warm-up steps when the model is created (so some sampled answers are right)",
    )
    real.add_argument("--spec", type=Path, default=None, help="job spec YAML for model, task and algorithm")
    real.add_argument("--keep", type=Path, default=None, help="write the states here and keep them (default: temp)")


def main(args: argparse.Namespace) -> int:
    if getattr(args, "source", "synthetic") == "real":
        return _main_real(args)
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


# ---- real trainer updates ----------------------------------------------------------------------------
def _public(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if not k.startswith("_")}


def aggregate(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over several pairs: totals of changed elements, bytes and seconds (not means of ratios)."""
    changed, numel = sum(p["_changed"] for p in pairs), sum(p["_numel"] for p in pairs)
    scanned = sum(p["_scanned"] for p in pairs)
    return {
        "changed_fraction": round(changed / max(numel, 1), 6),
        "bytes_per_changed_element": round(sum(p["_bytes"] for p in pairs) / max(changed, 1), 4),
        "encode_gb_per_s": round(scanned / sum(p["_encode_s"] for p in pairs) / 1e9, 3),
        "apply_gb_per_s": round(scanned / sum(p["_apply_s"] for p in pairs) / 1e9, 3),
        "bit_exact": all(p["bit_exact"] for p in pairs),
    }


def updates_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The trainer's update generator, run as its own process (the core does not import the trainer)."""
    cmd = [sys.executable, "-m", "trainer.delta_updates", "--out", str(out), "--steps", str(args.steps)]
    cmd += ["--lr", repr(args.lr), "--hidden", str(args.hidden), "--layers", str(args.layers)]
    cmd += ["--heads", str(args.heads), "--progress-json"]
    cmd += ["--warmup-steps", str(args.warmup_steps)]
    if args.spec is not None:
        cmd += ["--spec", str(args.spec)]
    return cmd


def generate_updates(
    args: argparse.Namespace, out: Path, on_event: Callable[[dict[str, Any]], None] = lambda e: None
) -> dict[str, Any]:
    """Run `python -m trainer.delta_updates`, passing its JSON progress lines to `on_event`; its updates.json.

    Raises RuntimeError with the tail of its stderr when it fails.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(updates_command(args, out), stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):  # third-party libraries print plain lines too
                with contextlib.suppress(json.JSONDecodeError):
                    on_event(json.loads(line))
        code = proc.wait()
        if code != 0:
            err.seek(0)
            lines = err.read().strip().splitlines()
            refused = [ln for ln in lines if ln.startswith("error: ")]
            if code == 2 and refused:  # bad input: its one clear line
                raise RuntimeError(refused[-1][len("error: ") :])
            tail = "\n".join(lines[-15:])
            raise RuntimeError(f"trainer.delta_updates exited with {code}:\n{tail}")
    return json.loads((out / "updates.json").read_text())


def run_real(args: argparse.Namespace, out: Path, on_event=lambda e: None) -> dict[str, Any]:
    """Real updates generated into `out`, then every consecutive pair benched; the figures to print."""
    from safetensors.torch import load_file

    info = generate_updates(args, out, on_event)
    files = [out / name for name in info["files"]]
    pairs, base = [], load_file(str(files[0]))
    for i, path in enumerate(files[1:], start=1):
        target = load_file(str(path))
        pairs.append({"pair": f"v{i - 1}->v{i}", **measure(base, target, args.repeat)})
        on_event({"event": "benched", "pair": i, "pairs": len(files) - 1})
        base = target
    return {
        "source": "real",
        **aggregate(pairs),
        "pairs": [_public(p) for p in pairs],
        "params": info["params"],
        "state_bytes": info["state_bytes"],
        "learning_rate": info["learning_rate"],
        "model": {k: info["model"][k] for k in ("hiddenSize", "numLayers", "numHeads", "warmupSteps")},
        "optimizer": info["optimizer"],
        "rollouts": info["rollouts"],
        "sampled_reward": [s["sampled_reward"] for s in info["steps"]],
    }


def _main_real(args: argparse.Namespace) -> int:
    if min(args.steps, args.hidden, args.layers, args.heads, args.repeat) < 1 or args.warmup_steps < 0:
        print("error: --steps, --hidden, --layers, --heads and --repeat must be positive", file=sys.stderr)
        return 2
    if args.spec is not None and not args.spec.is_file():
        print(f"error: --spec {args.spec}: no such file", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rlboost-delta-real-") as tmp:
        out = args.keep or Path(tmp)
        try:
            result = run_real(args, out) if args.json else _with_progress(args, out)
        except RuntimeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(result))
    else:
        _print_real(result)
    return 0


def _with_progress(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """run_real under a rich progress display: model ready, each training step, each benched pair."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
    )
    with Progress(*columns, TimeElapsedColumn(), transient=False) as bar:
        setup = bar.add_task("building the trainer engine (DeepSpeed, gloo)", total=1)
        train = bar.add_task("real GRPO steps", total=args.steps)
        bench = bar.add_task("benching consecutive bf16 states", total=args.steps)

        def on_event(e: dict[str, Any]) -> None:
            if e.get("event") == "model":
                bar.update(setup, completed=1, description=f"trainer engine ready: {e['params']:,} parameters")
            elif e.get("event") == "step":
                text = f"real GRPO steps (last: {e['seconds']} s, sampled reward {e['sampled_reward']})"
                bar.update(train, completed=e["step"], description=text)
            elif e.get("event") == "benched":
                bar.update(bench, completed=e["pair"])

        return run_real(args, out, on_event)


def _print_real(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    m = result["model"]
    title = (
        f"rlboost delta bench, real trainer updates: {result['params']:,} parameters "
        f"(hidden {m['hiddenSize']}, {m['numLayers']} layers), lr {result['learning_rate']}"
    )
    table = Table(title=title)
    table.add_column("pair")
    # Short headers so the table fits 80 columns; --json prints the full keys.
    for header in ("changed fraction", "B / changed elem.", "encode GB/s", "apply GB/s", "bit-exact"):
        table.add_column(header, justify="right")
    for p in result["pairs"]:
        table.add_row(p["pair"], *(str(p[k]) for k in PUBLIC_KEYS))
    table.add_row("all", *(str(result[k]) for k in PUBLIC_KEYS), style="bold")
    Console().print(table)
