# rlboost rollout-manager (gRPC). No torch on its import path.
# docker build -f docker/rollout-manager.Dockerfile -t ghcr.io/rlboost/rollout-manager:0.1.0 .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN pip install --no-deps . \
 && pip install "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "prometheus-client>=0.20" "numpy>=1.26" "grpcio==1.85.1" \
    "protobuf>=6" "nats-py>=2.9" "tenacity>=8"
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
EXPOSE 50051 9090
ENTRYPOINT ["python", "-m", "rollout_manager"]
