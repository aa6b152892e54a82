# rlboost rollout-worker on GPUs with the SGLang engine (`--engine sglang`), on the official SGLang image.
#
#   docker build -f docker/rollout-worker-sglang.Dockerfile -t ghcr.io/rlboost/rollout-worker-sglang:0.1.0 .
#   docker run --gpus all --ipc=host --shm-size 8g ghcr.io/rlboost/rollout-worker-sglang:0.1.0 \
#       --config /etc/rlboost/job.yaml --engine sglang --device cuda --dtype bfloat16 --pool spot \
#       --manager rollout-manager:50051 --weight-server http://weight-server:8600 --model-dir /models/policy
#
# The base is pinned to the SGLang release the backend is written and tested against (sglang==0.5.23,
# CUDA 13 wheels: sglang-kernel, flashinfer cu13). Bump BASE_IMAGE and scripts/setup_sglang_env.sh together.
# --ipc=host / a large /dev/shm: update_weights_from_tensor hands tensors to SGLang's scheduler process
# through shared memory.
ARG BASE_IMAGE=lmsysorg/sglang:v0.5.23-cu130
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost \
    NUMBA_CACHE_DIR=/tmp/numba-cache \
    RLBOOST_ENGINE=sglang RLBOOST_DEVICE=cuda RLBOOST_DTYPE=bfloat16 RLBOOST_METRICS_PORT=9090
WORKDIR /app

# The same extras and lock as the CPU worker (`worker`, plus `sglang`), but the image's own torch, CUDA
# libraries, transformers and sglang stay: scripts/lock_over_base.py pins what the image already holds at
# its installed versions, so pip adds only what the image lacks, at the lock's versions.
# pyproject.toml names README.md as the long description; an empty stand-in here keeps the dependency
# layers below depending only on pyproject.toml and the lock (a README edit rebuilds none of them).
COPY pyproject.toml ./
RUN touch README.md
COPY requirements/lock.txt requirements/
COPY scripts/lock_over_base.py scripts/
RUN python3 -c "import sglang; assert sglang.__version__ == '0.5.23', sglang.__version__" \
 && python3 scripts/lock_over_base.py requirements/lock.txt > /tmp/constraints.txt \
 && python3 -m pip install -c /tmp/constraints.txt '.[worker,sglang]'
COPY README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN python3 -m pip install --no-deps --force-reinstall . && rm -rf build

RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
# Smoke test: a module the service imports that the image lacks fails the build, not the pod.
COPY scripts/service_imports.py scripts/
RUN python3 scripts/service_imports.py --check rollout_worker
# /metrics and /healthz (--metrics-port)
EXPOSE 9090
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s CMD python3 -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('RLBOOST_METRICS_PORT', '9090'), timeout=4)"
ENTRYPOINT ["python3", "-m", "rollout_worker"]
