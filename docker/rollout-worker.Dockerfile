# rlboost rollout-worker, CPU build (torch engine): tests, laptops and CPU clusters.
# docker build -f docker/rollout-worker.Dockerfile -t ghcr.io/rlboost/rollout-worker:0.1.0 .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
# The CPU wheel of torch first, so pip does not pull a CUDA build for it.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.9.1 \
 && pip install --no-deps . \
 && pip install "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "prometheus-client>=0.20" "numpy>=1.26" "safetensors>=0.4" \
    "zstandard>=0.22" "tenacity>=8" "grpcio==1.85.1" "protobuf>=6" "nats-py>=2.9" "httpx>=0.27" \
    "transformers>=4.56" "tokenizers>=0.21"
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
EXPOSE 9090
ENTRYPOINT ["python", "-m", "rollout_worker"]
