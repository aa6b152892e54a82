# rlboost rollout-worker on GPUs with the SGLang engine (`--engine sglang`), on the official SGLang image.
#
#   docker build -f docker/rollout-worker-sglang.Dockerfile -t ghcr.io/rlboost/rollout-worker-sglang:0.1.0 .
#   docker run --gpus all --ipc=host --shm-size 8g ghcr.io/rlboost/rollout-worker-sglang:0.1.0 \
#       --config /etc/rlboost/job.yaml --engine sglang --device cuda --dtype bfloat16 --pool spot \
#       --manager rollout-manager:50051 --weight-server http://weight-server:8600 --model-dir /models/policy
#
# The base is pinned to the SGLang release the backend is written and tested against (sglang==0.5.23,
# CUDA 13 wheels: sglang-kernel, flashinfer cu13). Bump SGLANG_IMAGE and scripts/setup_sglang_env.sh together.
# --ipc=host / a large /dev/shm: update_weights_from_tensor hands tensors to SGLang's scheduler process
# through shared memory.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
FROM ${SGLANG_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost \
    RLBOOST_ENGINE=sglang RLBOOST_DEVICE=cuda RLBOOST_DTYPE=bfloat16 RLBOOST_METRICS_PORT=9090
WORKDIR /app

# Dependencies first (a layer that survives code edits). The image already holds torch, transformers,
# tokenizers, numpy, fastapi, uvicorn, pydantic and sglang: add only what rlboost needs besides, without
# letting pip touch the image's torch/transformers/sglang pins.
RUN python3 -c "import sglang, torch; assert sglang.__version__ == '0.5.23', sglang.__version__; print('sglang', sglang.__version__, 'torch', torch.__version__)" \
 && python3 -m pip freeze | grep -iE '^(torch|transformers|sglang|tokenizers)==' > /tmp/image-pins.txt \
 && python3 -m pip install -c /tmp/image-pins.txt \
    "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "prometheus-client>=0.20" "numpy>=1.26" "safetensors>=0.4" \
    "zstandard>=0.22" "xxhash>=3.4" "numba>=0.60" "tenacity>=8" "grpcio==1.85.1" "protobuf>=6" "nats-py>=2.9" \
    "httpx>=0.27"

COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN python3 -m pip install --no-deps . \
 && python3 -c "import rollout_worker.engine.sglang_engine as e; print('backend ok:', e.SglangEngine.name)"

RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
# /metrics and /healthz (--metrics-port)
EXPOSE 9090
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s CMD python3 -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLBOOST_METRICS_PORT', '9090'), timeout=4)"
ENTRYPOINT ["python3", "-m", "rollout_worker"]
