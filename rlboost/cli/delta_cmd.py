"""`rlboost delta`: encode, apply, inspect and benchmark sparse bit-exact weight deltas.

    rlboost delta encode --base A.safetensors --new B.safetensors -o D [--base-version 0 --version 1]
    rlboost delta apply --base A.safetensors --delta D -o C.safetensors
    rlboost delta inspect D [--json]
    rlboost delta bench [--json] [--elements N]
    rlboost delta bench --source real [--steps 3] [--lr 1e-6] [--hidden 384 --layers 4 --heads 6] [--json]
        (runs `python -m trainer.delta_updates` as a subprocess: the trainer's real engine and GRPO steps)

Wire-up (rlboost/cli/main.py): `delta_cmd.add_parser(subparsers)`; the parser's `func` default
is the handler, which returns the exit code. Bad input prints one `error: ...` line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `delta` and its subcommands on an argparse subparsers object."""
    from rlboost.delta.bench import add_arguments as add_bench_arguments

    p = subparsers.add_parser("delta", help="sparse, bit-exact weight deltas", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="delta_command", required=True)

    enc = sub.add_parser("encode", help="encode the change from one safetensors file to another")
    enc.add_argument("--base", required=True, type=Path, help="weights at the base version (.safetensors)")
    enc.add_argument("--new", required=True, type=Path, help="weights at the new version (.safetensors)")
    enc.add_argument("-o", "--output", required=True, type=Path, help="delta file to write")
    enc.add_argument("--base-version", type=int, default=0, help="version of --base (default 0)")
    enc.add_argument("--version", type=int, default=None, help="version of --new (default base-version + 1)")

    app = sub.add_parser("apply", help="apply a delta to a safetensors file")
    app.add_argument("--base", required=True, type=Path, help="weights at the delta's base version (.safetensors)")
    app.add_argument("--delta", required=True, type=Path, help="delta file")
    app.add_argument("-o", "--output", required=True, type=Path, help="safetensors file to write")

    ins = sub.add_parser("inspect", help="per-tensor changed fraction and bytes per changed element")
    ins.add_argument("delta", type=Path, help="delta file")
    ins.add_argument("--json", action="store_true", help="print the DeltaInfo as JSON")

    bench = sub.add_parser(
        "bench", help="size and speed on synthetic RL-like bf16 updates, or on the trainer's real ones (--source real)"
    )
    add_bench_arguments(bench)

    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Handle `rlboost delta ...`; returns the exit code."""
    from rlboost.delta.format import DeltaError

    handlers = {"encode": _encode, "apply": _apply, "inspect": _inspect, "bench": _bench}
    try:
        return handlers[args.delta_command](args)
    except DeltaError as e:
        return _fail(str(e))
    except FileNotFoundError as e:
        return _fail(f"no such file: {e.filename}")
    except (OSError, ValueError) as e:  # unreadable file, not safetensors, ...
        return _fail(f"{type(e).__name__}: {e}")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _load(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise FileNotFoundError(2, "No such file", str(path))
    return path.read_bytes()


def _encode(args: argparse.Namespace) -> int:
    import rlboost.delta as rd

    version = args.version if args.version is not None else args.base_version + 1
    blob = rd.encode(_load(args.base), _load(args.new), base_version=args.base_version, version=version)
    args.output.write_bytes(blob)
    info = rd.inspect(blob)
    print(
        f"wrote {args.output}: {len(blob):,} bytes, {info.changed:,} of {info.numel:,} elements changed "
        f"({info.changed_fraction:.3%}), {_fmt(info.bytes_per_changed)} B per changed element"
    )
    return 0


def _apply(args: argparse.Namespace) -> int:
    from safetensors.torch import save_file

    import rlboost.delta as rd

    out = rd.apply(_load(args.base), _read(args.delta))
    save_file(out, str(args.output))
    print(f"wrote {args.output}: {len(out)} tensors")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    import rlboost.delta as rd

    info = rd.inspect(_read(args.delta))
    if args.json:
        print(info.model_dump_json())
        return 0
    title = (
        f"delta v{info.base_version} -> v{info.version} (format {info.format_version}): {info.total_bytes:,} bytes, "
        f"{info.changed_fraction:.3%} changed, {_fmt(info.bytes_per_changed)} B/changed"
    )
    table = Table(title=title)
    table.add_column("tensor", overflow="fold")  # long parameter names wrap rather than vanish
    for col in ("dtype", "shape", "encoding", "changed", "fraction", "bytes", "B/changed"):
        table.add_column(col, justify="left" if col in ("dtype", "encoding") else "right", no_wrap=True)
    for t in info.tensors:
        table.add_row(
            t.name,
            t.dtype,
            "x".join(map(str, t.shape)) or "scalar",
            t.encoding,
            f"{t.changed:,}",
            f"{t.changed_fraction:.3%}",
            f"{t.bytes:,}",
            _fmt(t.bytes_per_changed),
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)  # pipes get whole names
    return 0


def _bench(args: argparse.Namespace) -> int:
    from rlboost.delta.bench import main

    return main(args)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m rlboost.cli.delta_cmd ...`) until the lead wires `delta` into main."""
    parser = argparse.ArgumentParser(prog="rlboost")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
