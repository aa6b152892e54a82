"""tensorParallel reaching the engines: SGLang gets tp_size from it, the torch engine refuses more than 1, and the
worker takes a spot variant's from `--variant`. No engine is started (SGLang's arguments are computed only)."""

from __future__ import annotations

import pytest

from rlboost.options.worker import WorkerOptions
from rollout_worker.__main__ import _pool_spec
from rollout_worker.engine import make_engine
from rollout_worker.engine.sglang_engine import SglangEngine


def test_sglang_gets_tp_size_from_tensor_parallel():
    assert "tp_size" not in SglangEngine(capacity=4, device="cuda").engine_kwargs("/m")  # SGLang's default, 1
    engine = make_engine("sglang", capacity=4, device="cuda", tensor_parallel=2)
    assert engine.engine_kwargs("/m")["tp_size"] == 2


def test_torch_engine_refuses_tensor_parallel():
    with pytest.raises(ValueError, match="engine torch requires tensorParallel 1"):
        make_engine("torch", capacity=4, tensor_parallel=2)


def test_worker_takes_the_variants_pool(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(
        "rollout:\n  spot:\n    engine: sglang\n    capacity: 8\n    variants:\n"
        "    - {name: a10g, pricePerGpuHour: 1.0, gpusPerWorker: 2, tensorParallel: 2, capacity: 48}\n"
    )
    opts = WorkerOptions.from_argv(["--config", str(config), "--pool", "spot", "--variant", "a10g"])
    pool = _pool_spec(opts)
    assert (pool.capacity, pool.tensor_parallel, pool.gpus_per_worker) == (48, 2, 2)
    assert _pool_spec(WorkerOptions.from_argv(["--config", str(config), "--pool", "spot"])).capacity == 8
    with pytest.raises(SystemExit, match="no spot variant 'l4'"):
        _pool_spec(WorkerOptions.from_argv(["--config", str(config), "--pool", "spot", "--variant", "l4"]))
    with pytest.raises(SystemExit, match="add --pool spot"):
        _pool_spec(WorkerOptions.from_argv(["--config", str(config), "--variant", "a10g"]))
