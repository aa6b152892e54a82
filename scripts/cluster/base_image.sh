#!/usr/bin/env bash
# The container plumbing of this repository's test lane, on machines where no base image can be pulled.
#
# Installs podman, runc and debootstrap (apt) when missing, writes the containers.conf settings this
# host needs (runc as the OCI runtime: crun fails on hybrid cgroups; no default ulimits: setting
# RLIMIT_NOFILE is refused), and makes a Debian bookworm base image with python3 once, cached by tag.
# Prints the base image's tag on stdout (progress goes to stderr).
#
#   scripts/cluster/base_image.sh            # -> localhost/rlboost-base:bookworm
#
# Users with a normal registry never need this: the Dockerfiles default to python:3.11-slim-bookworm.
set -euo pipefail

BASE_TAG=${RLBOOST_BASE_TAG:-localhost/rlboost-base:bookworm}
CONTAINERS_CONF=${CONTAINERS_CONF:-/etc/containers/containers.conf}
say() { echo "[base-image] $*" >&2; }

install_tools() {
  local missing=()
  command -v podman >/dev/null || missing+=(podman)
  command -v runc >/dev/null || missing+=(runc)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  ((${#missing[@]} == 0)) && return
  say "installing ${missing[*]} (apt-get)"
  apt-get update -q >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2
}

write_containers_conf() {
  # Written only when absent, so a machine's own settings are never overwritten.
  [[ -e $CONTAINERS_CONF ]] && return
  say "writing $CONTAINERS_CONF (runtime runc, no default ulimits)"
  mkdir -p "$(dirname "$CONTAINERS_CONF")"
  cat >"$CONTAINERS_CONF" <<'CONF'
# Written by rlboost scripts/cluster/base_image.sh for this host.
[containers]
# Setting RLIMIT_NOFILE in a container is refused on this host.
default_ulimits = []

[engine]
# crun fails on this host's hybrid cgroups.
runtime = "runc"
CONF
}

make_base() {
  if podman image exists "$BASE_TAG"; then
    say "$BASE_TAG already built"
    return
  fi
  local root
  root=$(mktemp -d /tmp/rlboost-rootfs.XXXXXX)
  trap 'rm -rf "$root"' RETURN
  say "debootstrap bookworm (minbase + python3, about a minute) into $root"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" >&2
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  say "importing as $BASE_TAG"
  tar -C "$root" -c . | podman import \
    --change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV=LANG=C.UTF-8' \
    --change 'CMD=["/bin/bash"]' \
    - "$BASE_TAG" >&2
}

install_tools
write_containers_conf
make_base
echo "$BASE_TAG"
