# rlboost trainer, CPU build (DeepSpeed on gloo): the `trainer` extra of pyproject.toml at requirements/lock.txt's
# versions, with torch's CPU build. GPU clusters run trainer-cuda.Dockerfile (the release publishes that one).
# From the repository root (`make images` builds every image):
#   docker build -f docker/trainer.Dockerfile -t ghcr.io/rlboost/trainer:0.1.0 .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
# numba caches the codec's compiled kernels; site-packages is not writable by the service's user.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PATH=/opt/rlboost/bin:$PATH \
    NUMBA_CACHE_DIR=/tmp/numba-cache
# The same arithmetic on every x86 node (AVX2, also where AVX-512 exists): rlboost/cpu_numerics.py says why; a pod's
# own env overrides these.
ENV ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
RUN python3 -m venv /opt/rlboost
WORKDIR /app
# torch alone first, its CPU build (the index's 2.13.0+cpu satisfies the lock's torch==2.13.0 and wins over
# PyPI's CUDA build): the same layer as in rollout-worker.Dockerfile, so the two images share it.
# An empty TORCH_INDEX_URL takes torch from pip's own configuration.
COPY requirements/lock.txt requirements/
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install -c requirements/lock.txt ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} torch
# The service's dependencies, from pyproject and the lock only: this layer survives code edits.
# No compiler in the image: the trainer keeps DeepSpeed from building its shm all-reduce op (trainer.engine), and
# training uses torch's AdamW, not DeepSpeed's fused one.
# pyproject.toml names README.md as the long description; an empty stand-in here keeps the dependency
# layers below depending only on pyproject.toml and the lock (a README edit rebuilds none of them).
COPY pyproject.toml ./
RUN touch README.md
# reasoning-gym's pycosat ships no wheel: a compiler (and Python's headers where the base lacks them) for this
# layer only, purged before the layer ends (the image keeps none).
RUN build="gcc libc6-dev" \
 && python3 -c "import os, sysconfig; assert os.path.exists(sysconfig.get_path('include') + '/Python.h')" \
    2>/dev/null || build="$build python3-dev" \
 && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $build \
 && pip install -c requirements/lock.txt '.[trainer]' \
 && apt-get purge -y -q --auto-remove $build && rm -rf /var/lib/apt/lists/*
COPY README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN pip install --no-deps --force-reinstall . && rm -rf build
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost \
 && mkdir /data && chown 10001:10001 /data
USER 10001:10001
# Smoke test: a module the service imports that the image lacks fails the build, not the pod.
COPY scripts/service_imports.py scripts/
RUN python scripts/service_imports.py --check trainer
VOLUME /data
EXPOSE 29500 9090
ENTRYPOINT ["python", "-m", "trainer"]
