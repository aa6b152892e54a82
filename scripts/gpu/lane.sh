#!/usr/bin/env bash
# `make test-gpu` on a lent GPU machine (run by the device tool in the repo root, with .whl/ carried: see
# scripts/gpu/wheelhouse.sh). Installs the wheels over the image's packages, checks the imports in one line, runs
# the lane under the Makefile's bound (ENGINE_BENCH=1: bench/engine_bench.py on CUDA first) and copies its log and JSON figures to $OUT.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L
python3 -c "import torch, transformers, deepspeed, grpc, pydantic, fastapi, uvicorn, nats, rlboost, rollout_worker, \
trainer, weight_server, rollout_manager; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" || exit 4
command -v nats-server || exit 5
if [ -n "${ENGINE_BENCH:-}" ]; then  # the torch engine's decode on CUDA: alone (timed per iteration), then 3 at once
  eb="python3 bench/engine_bench.py --device cuda --dtype bfloat16 --requests 8 --tokens 160"
  timeout 90 $eb --breakdown 2>/dev/null | tail -1 | tee "$OUT/engine_alone.json"
  for i in 1 2 3; do timeout 90 $eb 2>/dev/null | tail -1 >"$OUT/engine_shared_$i.json" & done; wait
  cat "$OUT"/engine_shared_*.json
fi
args="--basetemp=/tmp/pt ${PYTEST_ARGS:-}"
if command -v make >/dev/null; then  # the README's command, with the machine's python (no .venv is built)
  make test-gpu PY=python3 PYTEST_ARGS="$args" 2>&1 | tee "$OUT/lane.log"
else
  timeout 465 python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -rs -s $args 2>&1 | tee "$OUT/lane.log"
fi
rc=${PIPESTATUS[0]}
for f in $(find /tmp/pt -name preemption.json -o -name report.json 2>/dev/null); do
  cp "$f" "$OUT/$(echo "${f#/tmp/pt/}" | tr '/' '_')"; done
tar czf "$OUT/logs.tgz" --exclude="*.safetensors" --exclude="*.bin" --exclude="*.pt" --exclude="*.npy" -C /tmp/pt . 2>/dev/null
echo "lane rc=$rc"; exit $rc
