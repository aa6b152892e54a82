"""Generate the Python gRPC stubs from protos/ into the core package.

python scripts/gen_protos.py          # (re)write rlboost/rollout/v1/*_pb2*.py
python scripts/gen_protos.py --check  # exit 1 if the checked-in stubs differ (CI)
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "protos"


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc

    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
    ]
    if protoc.main(args + [str(p) for p in protos]) != 0:
        sys.exit("protoc failed")
    return [p for p in out_dir.rglob("*_pb2*.py*")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        stale = []
        for generated in generate(tmp_dir):
            target = ROOT / generated.relative_to(tmp_dir)
            if args.check:
                if not target.exists() or not filecmp.cmp(generated, target, shallow=False):
                    stale.append(str(target.relative_to(ROOT)))
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(generated.read_bytes())
        if stale:
            print("gRPC stubs out of date; run `python scripts/gen_protos.py`:", *stale, sep="\n  ")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
