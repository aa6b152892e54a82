# rlboost weight-server (FastAPI, uvicorn[standard], the delta codec): the `weight-server` extra of
# pyproject.toml at requirements/lock.txt's versions; no torch.
# From the repository root (`make images` builds every image):
#   docker build -f docker/weight-server.Dockerfile -t ghcr.io/rlboost/weight-server:0.1.0 .
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
# numba caches the codec's compiled kernels; site-packages is not writable by the service's user.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PATH=/opt/rlboost/bin:$PATH \
    NUMBA_CACHE_DIR=/tmp/numba-cache
RUN python3 -m venv /opt/rlboost
WORKDIR /app
# Dependencies first, from pyproject and the lock only: this layer survives code edits.
# pyproject.toml names README.md as the long description; an empty stand-in here keeps the dependency
# layers below depending only on pyproject.toml and the lock (a README edit rebuilds none of them).
COPY pyproject.toml ./
RUN touch README.md
COPY requirements/lock.txt requirements/
RUN pip install -c requirements/lock.txt '.[weight-server]'
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
RUN python scripts/service_imports.py --check weight_server
VOLUME /data
EXPOSE 8000
ENTRYPOINT ["python", "-m", "weight_server"]
