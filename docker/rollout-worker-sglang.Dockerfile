# rlboost rollout-worker on GPUs with the SGLang engine, on the official pinned SGLang image.
# docker build -f docker/rollout-worker-sglang.Dockerfile -t ghcr.io/rlboost/rollout-worker-sglang:0.1.0 .
FROM lmsysorg/sglang:v0.5.3-cu129
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HOME=/home/rlboost
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
# SGLang's image already holds torch, transformers and sglang: add only what rlboost needs besides.
RUN pip install --no-deps . \
 && pip install "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "prometheus-client>=0.20" "safetensors>=0.4" \
    "zstandard>=0.22" "tenacity>=8" "grpcio==1.85.1" "protobuf>=6" "nats-py>=2.9" "httpx>=0.27"
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
EXPOSE 9090
ENTRYPOINT ["python", "-m", "rollout_worker"]
