# rlboost env-runner (agentic episodes: environments and their episodes' turns): the `env-runner` extra of
# pyproject.toml at requirements/lock.txt's versions; no torch (it tokenises with `tokenizers`/`transformers`).
# From the repository root (`make images` builds every image):
#   docker build -f docker/env-runner.Dockerfile -t ghcr.io/rlboost/env-runner:0.1.0 .
# A user's environments (entry points of `rlboost.environments`) are installed on top of it:
#   FROM ghcr.io/rlboost/env-runner:0.1.0
#   RUN pip install my-environments
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PATH=/opt/rlboost/bin:$PATH
RUN python3 -m venv /opt/rlboost
WORKDIR /app
# Dependencies first, from pyproject and the lock only: this layer survives code edits.
COPY pyproject.toml ./
RUN touch README.md
COPY requirements/lock.txt requirements/
# reasoning-gym's pycosat ships no wheel: a compiler (and Python's headers where the base lacks them) for this
# layer only, purged before the layer ends (the image keeps none).
RUN build="gcc libc6-dev" \
 && python3 -c "import os, sysconfig; assert os.path.exists(sysconfig.get_path('include') + '/Python.h')" \
    2>/dev/null || build="$build python3-dev" \
 && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $build \
 && pip install -c requirements/lock.txt '.[env-runner]' \
 && apt-get purge -y -q --auto-remove $build && rm -rf /var/lib/apt/lists/*
COPY README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN pip install --no-deps --force-reinstall . && rm -rf build
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
# Smoke test: a module the service imports that the image lacks fails the build, not the pod. The model factory's
# torch, datasets and model sources are reached only through rlboost.models' package and are never called here.
COPY scripts/service_imports.py scripts/
RUN python scripts/service_imports.py --check env_runner --without torch --without datasets --without pyarrow --without fsspec --without huggingface_hub
EXPOSE 9090
ENTRYPOINT ["python", "-m", "env_runner"]
