#!/usr/bin/env bash
# `make images`: builds every CPU image from docker/*.Dockerfile with podman or docker (whichever is present),
# tagged $REGISTRY/<name>:<the chart's appVersion>, one at a time, then prints each image's size.
# Each build ends with its service's import smoke test, so an image lacking a module fails here.
# `make push-images` (--push) pushes what `make images` built, retagged under $REGISTRY.
#
#   scripts/build_images.sh                       # every CPU image
#   IMAGES="operator weight-server" scripts/build_images.sh
#   REGISTRY=my.registry/rlboost scripts/build_images.sh --push
#
# Environment: ENGINE (podman|docker; default: the one present), REGISTRY (default ghcr.io/rlboost), TAG
# (default: appVersion of deploy/helm/rlboost/Chart.yaml), IMAGE_BASE (pull: the Dockerfiles' own base;
# lane: this repo's test machines, which cannot pull one, see scripts/cluster/lane.sh; default: lane where
# pip is configured with a local wheel directory, else pull), BUILD_TIMEOUT (seconds per image, 1800),
# BUILD_ARGS (extra arguments to the engine's build). Logs: build/images/<name>.log.
# GPU images (trainer-cuda, rollout-worker-sglang) are built by .github/workflows/release.yml.
set -euo pipefail
cd "$(dirname "$0")/.."

# Build order: the small services first; rollout-worker and trainer share their torch layer.
ALL_IMAGES="rollout-manager weight-server operator rollout-worker trainer env-runner"
IMAGES=${IMAGES:-$ALL_IMAGES}
REGISTRY=${REGISTRY:-ghcr.io/rlboost}
BUILT_REGISTRY=ghcr.io/rlboost
TAG=${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/rlboost/Chart.yaml)}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-1800}
LOG_DIR=build/images
say() { echo "[images $(date +%H:%M:%S)] $*"; }

pick_engine() {
  if [[ -n ${ENGINE:-} ]]; then echo "$ENGINE"; return; fi
  if command -v podman >/dev/null; then echo podman; return; fi
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then echo docker; return; fi
  echo "no container engine: install podman or docker (or set ENGINE)" >&2
  exit 1
}

image_base() {
  if [[ -n ${IMAGE_BASE:-} ]]; then echo "$IMAGE_BASE"; return; fi
  local links
  links=$(pip config get global.find-links 2>/dev/null || true)
  [[ -n $links && -d $links ]] && echo lane || echo pull
}

human_size() { numfmt --to=iec-i --suffix=B "$1" 2>/dev/null || echo "${1}B"; }

build_one() {
  local name=$1 ref=$BUILT_REGISTRY/$1:$TAG log=$LOG_DIR/$1.log start rc=0
  start=$(date +%s)
  say "building $ref (docker/$name.Dockerfile; log $log)"
  # The engine's own step lines show progress; the full output (pip's) goes to the log. The log exists
  # before tail opens it.
  : >"$log"
  timeout "$BUILD_TIMEOUT" "$ENGINE_BIN" build -f "docker/$name.Dockerfile" -t "$ref" \
    "${LANE_BUILD_ARGS[@]}" ${BUILD_ARGS:-} . >>"$log" 2>&1 &
  local pid=$!
  tail -n +1 -f "$log" --pid "$pid" 2>/dev/null | grep --line-buffered -E '^(STEP [0-9]+/|#[0-9]+ \[|Step [0-9]+/|ok )' || true
  wait "$pid" || rc=$?
  if ((rc != 0)); then
    tail -n 40 "$log"
    ((rc == 124)) && say "FAILED $name: over BUILD_TIMEOUT=${BUILD_TIMEOUT}s" || say "FAILED $name (exit $rc)"
    exit 1
  fi
  BUILD_SECONDS[$name]=$(($(date +%s) - start))
  say "built $ref in ${BUILD_SECONDS[$name]}s"
}

report() {
  printf '%-46s %10s %8s\n' IMAGE SIZE BUILD
  local name size
  for name in $IMAGES; do
    size=$("$ENGINE_BIN" image inspect --format '{{.Size}}' "$BUILT_REGISTRY/$name:$TAG")
    printf '%-46s %10s %7ss\n' "$BUILT_REGISTRY/$name:$TAG" "$(human_size "$size")" "${BUILD_SECONDS[$name]:--}"
  done
}

push_all() {
  local name
  for name in $IMAGES; do
    if [[ $REGISTRY != "$BUILT_REGISTRY" ]]; then
      "$ENGINE_BIN" tag "$BUILT_REGISTRY/$name:$TAG" "$REGISTRY/$name:$TAG"
    fi
    say "pushing $REGISTRY/$name:$TAG"
    "$ENGINE_BIN" push "$REGISTRY/$name:$TAG"
  done
}

LANE_BUILD_ARGS=()
declare -A BUILD_SECONDS=()
if [[ ${1:-} == --push ]]; then
  ENGINE_BIN=$(pick_engine)
  push_all
  exit 0
fi
if [[ $(image_base) == lane ]]; then
  source scripts/cluster/lane.sh  # installs podman when missing, so before the engine is picked
fi
ENGINE_BIN=$(pick_engine)
mkdir -p "$LOG_DIR"
say "engine $ENGINE_BIN, tag $TAG, base $(image_base), images: $IMAGES"
for name in $IMAGES; do
  [[ -f docker/$name.Dockerfile ]] || { say "no docker/$name.Dockerfile (images: $ALL_IMAGES)"; exit 1; }
  build_one "$name"
done
report
