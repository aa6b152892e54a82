# rlboost weight-server (FastAPI + uvicorn). No torch on its import path.
# docker build -f docker/weight-server.Dockerfile -t ghcr.io/rlboost/weight-server:0.1.0 .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN pip install --no-deps . \
 && pip install "pydantic>=2.8,<3" "pyyaml>=6" "rich>=13" "prometheus-client>=0.20" "numpy>=1.26" "safetensors>=0.4" \
    "zstandard>=0.22" "nats-py>=2.9" "fastapi>=0.110" "uvicorn>=0.30" "httpx>=0.27"
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin rlboost && mkdir /data && chown 10001:10001 /data
USER 10001:10001
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["python", "-m", "weight_server"]
