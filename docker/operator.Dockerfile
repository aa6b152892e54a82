# rlboost operator (kopf). No torch: the core is installed without its heavy dependencies.
# Build from the repository root: docker build -f docker/operator.Dockerfile -t ghcr.io/rlboost/operator:0.1.0 .
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rlboost ./rlboost
COPY operator ./operator
COPY services ./services
RUN pip install --no-deps . \
 && pip install "pydantic>=2.8,<3" "pyyaml>=6" "prometheus-client>=0.20" "nats-py>=2.9" "kopf>=1.37" "aiohttp>=3.9" "rich>=13"
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin rlboost
USER 10001:10001
EXPOSE 9090 8080
ENTRYPOINT ["python", "-m", "rlboost_operator"]
