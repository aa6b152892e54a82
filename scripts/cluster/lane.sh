# Sourced by scripts/build_images.sh when IMAGE_BASE=lane: builds on this test lane's machines, where no base
# image can be pulled and pip reaches packages only through this machine's own configuration.
#
# Makes (once) the debootstrap base (base_image.sh) and sets LANE_BUILD_ARGS: the base as BASE_IMAGE, torch
# from pip's configuration instead of the PyTorch index (TORCH_INDEX_URL empty), and, mounted into every
# RUN of the build (not into the image), a pip.conf that gives pip this machine's CA bundle, its local
# wheel directory (the CPU torch wheel) and its pip constraints. Builds share the host's network.
# Nothing here is in the Dockerfiles: users build them on python:3.11-slim-bookworm as they are.
# (podman leaves the mount points behind in the image: an empty /etc/pip.conf, /etc/rlboost-lane/ca.crt and
# /opt/rlboost-wheels; they change nothing.)

lane_dir=$(mktemp -d /tmp/rlboost-lane.XXXXXX)
trap 'rm -rf "$lane_dir"' EXIT
lane_base=$(bash "$(dirname "${BASH_SOURCE[0]}")/base_image.sh")

lane_ca=${LANE_CA_BUNDLE:-$(pip config get global.cert 2>/dev/null || echo /etc/ssl/certs/ca-certificates.crt)}
lane_wheels=${LANE_WHEELS:-$(pip config get global.find-links 2>/dev/null || echo /opt/wheels)}
lane_constraints=${LANE_PIP_CONSTRAINTS:-$(pip config get global.constraint 2>/dev/null || true)}

LANE_BUILD_ARGS=(--network host --build-arg "BASE_IMAGE=$lane_base" --build-arg "TORCH_INDEX_URL="
  --volume "$lane_dir/pip.conf:/etc/pip.conf:ro" --volume "$lane_ca:/etc/rlboost-lane/ca.crt:ro")
{
  echo "[global]"
  echo "cert = /etc/rlboost-lane/ca.crt"
  echo "timeout = 180"
  echo "disable-pip-version-check = true"
} >"$lane_dir/pip.conf"
if [[ -d $lane_wheels ]]; then
  echo "find-links = /opt/rlboost-wheels" >>"$lane_dir/pip.conf"
  LANE_BUILD_ARGS+=(--volume "$lane_wheels:/opt/rlboost-wheels:ro")
fi
if [[ -f $lane_constraints ]]; then
  echo "constraint = /etc/rlboost-lane/constraints.txt" >>"$lane_dir/pip.conf"
  LANE_BUILD_ARGS+=(--volume "$lane_constraints:/etc/rlboost-lane/constraints.txt:ro")
fi
