#!/usr/bin/env bash
# Regenerates requirements/lock.txt: one resolution of every extra (manager, weight-server, worker, trainer,
# operator, local, dev, compare) for CPython 3.11 on x86-64 Linux, with requirements/pins.in's pins.
# The lock is a constraints file: every Dockerfile and the Makefile's venv install with
# `pip install -c requirements/lock.txt '.[extra]'`, so each image gets exactly its extra's packages, at the
# versions CI tested. sglang is not in it (it pins its own CUDA torch; see docker/rollout-worker-sglang.Dockerfile).
#
#   scripts/lock.sh            # rewrite the lock (after changing pyproject.toml's dependencies)
#   scripts/lock.sh --check    # fail if the lock is stale
#
# Needs uv (`pip install uv`); resolves against PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
LOCK=requirements/lock.txt
out=$LOCK
# --check resolves into a copy of the lock: uv keeps an output file's pins where they still fit, so the check fails
# on a changed pyproject.toml or pins.in, not on whatever PyPI released since
[[ ${1:-} == --check ]] && out=$(mktemp) && cp "$LOCK" "$out"
UV_CUSTOM_COMPILE_COMMAND="scripts/lock.sh" "$UV" pip compile pyproject.toml \
  --extra manager --extra weight-server --extra worker --extra trainer --extra operator --extra local --extra dev --extra compare \
  --constraint requirements/pins.in \
  --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --no-emit-package rlboost --no-header --annotation-style line --quiet \
  --output-file "$out"
if [[ ${1:-} == --check ]]; then
  diff -u "$LOCK" "$out" >/dev/null || { echo "$LOCK is stale: run scripts/lock.sh" >&2; exit 1; }
  echo "$LOCK is current"
fi
