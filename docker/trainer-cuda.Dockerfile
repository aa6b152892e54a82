# rlboost trainer on GPUs (DeepSpeed, NCCL), on the official PyTorch CUDA image: the image the release
# publishes as `trainer` (docker/trainer.Dockerfile is the CPU build `make images` makes).
#   docker build -f docker/trainer-cuda.Dockerfile -t ghcr.io/rlboost/trainer:0.1.0 .
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-devel
FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost \
    NUMBA_CACHE_DIR=/tmp/numba-cache
WORKDIR /app

# The same extra and lock as the CPU trainer, but the image's own torch and CUDA libraries stay:
# scripts/lock_over_base.py pins what the image already holds at its installed versions, so pip adds only
# what the image lacks, at the lock's versions.
# pyproject.toml names README.md as the long description; an empty stand-in here keeps the dependency
# layers below depending only on pyproject.toml and the lock (a README edit rebuilds none of them).
COPY pyproject.toml ./
RUN touch README.md
COPY requirements/lock.txt requirements/
COPY scripts/lock_over_base.py scripts/
RUN python3 scripts/lock_over_base.py requirements/lock.txt > /tmp/constraints.txt \
 && python3 -m pip install -c /tmp/constraints.txt '.[trainer]'
COPY README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN python3 -m pip install --no-deps --force-reinstall . && rm -rf build

RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost \
 && mkdir /data && chown 10001:10001 /data
USER 10001:10001
# Smoke test: a module the service imports that the image lacks fails the build, not the pod.
COPY scripts/service_imports.py scripts/
RUN python3 scripts/service_imports.py --check trainer
VOLUME /data
EXPOSE 29500 9090
ENTRYPOINT ["python3", "-m", "trainer"]
