# rlboost trainer (DeepSpeed, NCCL) on the official PyTorch CUDA runtime image.
# docker build -f docker/trainer.Dockerfile -t ghcr.io/rlboost/trainer:0.1.0 .
FROM pytorch/pytorch:2.9.1-cuda12.8-cudnn9-devel
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
# torch comes from the base image; everything else from pyproject (deepspeed JIT-builds its ops on first use).
RUN pip install .
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost && mkdir /data && chown 10001:10001 /data
USER 10001:10001
VOLUME /data
EXPOSE 29500 9090
ENTRYPOINT ["python", "-m", "trainer"]
