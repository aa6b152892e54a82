# rlboost — two commands on a fresh machine:
#   make run    build .venv from nothing, then `rlboost local` on the embedded default example
#   make test   build .venv from nothing, then lint, contracts, stub check and the test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU build from local disk on these machines; set TORCH_SPEC= (empty) where torch is already right.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.installed
# Every install takes its versions from the one lock (scripts/lock.sh), as the images do.
LOCK   := requirements/lock.txt
PYTEST_ARGS ?=

.PHONY: run test tools lint check-generated generate test-fast test-sglang run-sglang images push-images lock test-cluster test-cluster-chaos test-gpu clean

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(if $(TORCH_SPEC),$(PIP) install -q -c $(LOCK) "$(TORCH_SPEC)")
	$(PIP) install -q -c $(LOCK) -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/rlboost local

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# gRPC stubs from protos/, the RLJob CRD from rlboost/spec.py: generated, checked in, checked here
check-generated: $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_crd.py --check

generate: $(STAMP)
	$(PY) scripts/gen_protos.py
	$(PY) scripts/gen_crd.py

# Tools from the OS: promtool (alert-rule unit tests). Installed with apt-get where we are root (CI, these
# machines); elsewhere the tests that need them skip and say which package to install.
tools:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus) \
	  >/dev/null; } || echo "make tools: promtool unavailable (apt-get install prometheus): its tests will skip"

test: $(STAMP) tools lint check-generated
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

# SGLang on CPU needs its own environment (sglang pins a CUDA torch): scripts/setup_sglang_env.sh
SGLANG_VENV := .venv-sglang
test-sglang:
	bash scripts/setup_sglang_env.sh
	$(SGLANG_VENV)/bin/python -m pytest -m sglang tests/rollout_worker/test_engine_contract.py tests/rollout_worker/test_colocation_contract.py \
		tests/rollout_worker/test_worker_process.py $(PYTEST_ARGS)

run-sglang:
	bash scripts/setup_sglang_env.sh
	$(SGLANG_VENV)/bin/rlboost local --engine sglang

# Container images (podman or docker), tagged with the chart's appVersion; see README "Images".
images:
	bash scripts/build_images.sh

# REGISTRY=my.registry/rlboost make push-images: push what `make images` built, under that registry
push-images:
	bash scripts/build_images.sh --push

# Re-resolve requirements/lock.txt after changing pyproject.toml's dependencies (needs uv)
lock:
	bash scripts/lock.sh

# The cluster lane (issue 13), CI's: examples/rljob.yaml through kmock, the podlet (kubelet stand-in), the
# operator's image and every pod as a podman container; run uninterrupted, then with faults (a spot pod deleted,
# the trainer killed, a spot node tainted and deleted: same final weights checksum, no sample lost), then with an
# impossible model source (Failed naming spec.model). Root and podman; installs what it needs.
test-cluster: $(STAMP)
	bash scripts/cluster/setup.sh
	timeout 2400 $(PY) -m pytest -m cluster tests/cluster/test_cluster_e2e.py -p no:cacheprovider $(PYTEST_ARGS)

# Only the faulted run and the uninterrupted one it is compared with (part of test-cluster)
test-cluster-chaos: $(STAMP)
	bash scripts/cluster/setup.sh
	timeout 1800 $(PY) -m pytest -m cluster tests/cluster/test_cluster_e2e.py -k faults -p no:cacheprovider $(PYTEST_ARGS)

# The GPU lane (tests/gpu): the default job learning on CUDA (torch engine, NCCL, bf16), what a preemption costs on
# CUDA (bench/preemption_bench.py --device cuda: notice, silent, expired; tokens/s per worker), and the CPU example's
# shape with SGLang on CUDA. Each skips, saying why, without a GPU (or SGLang). Under 8 minutes on one H100: every run
# is bounded (tests/gpu/lane.py), the whole at 465 s. -s: the figures print. Run it in the environment that has CUDA
# torch (and sglang: `pip install -c requirements/lock.txt '.[dev]' 'rlboost[sglang]'`): make test-gpu PY=that/python
# (with PY given, no .venv is built: a GPU machine without network runs it so, through scripts/gpu/lane.sh).
test-gpu: $(if $(filter command line,$(origin PY)),,$(STAMP))
	timeout 465 $(PY) -m pytest -m gpu tests/gpu -p no:cacheprovider -rs -s $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
