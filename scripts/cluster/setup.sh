#!/usr/bin/env bash
# Set-up of the cluster lane (`make test-cluster`), idempotent: safe to run on every CI run.
#
# - podman, runc, debootstrap, the containers.conf this host needs and the debootstrap base image:
#   scripts/cluster/base_image.sh (shared with `make images`);
# - prometheus (Debian's package, with promtool): the lane scrapes the pods with a real server.
# Needs root (apt-get); on a machine where everything is present it installs nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "[cluster-setup] $*" >&2; }

missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
if ((${#missing[@]})); then
  say "installing ${missing[*]} (apt-get)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
fi
# Debian's package starts a system Prometheus on :9090; the lane runs its own, so that one is not needed.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
fi
bash scripts/cluster/base_image.sh >/dev/null
say "ready: $(podman --version), $(prometheus --version 2>&1 | head -1)"
