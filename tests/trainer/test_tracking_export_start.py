"""The trainer's tracking and export set-up: a backend or an export destination that cannot work stops the trainer
at start, naming the spec field (before NATS, the manager or a step), and the per-step pool metrics it computes
from the manager's status (a ManagerStatus built here: the real manager's GetStatus is covered by its own tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.export import ExportError
from rlboost.nats_server import free_port
from rlboost.options.trainer import TrainerOptions
from rlboost.spec import ExportSpec, LoggingSpec
from rlboost.tracking import TrackingError
from rlboost.wire.rollout_io import ManagerStatus, Pool, WorkerStatus
from tests.trainer.conftest import tiny_spec
from trainer.pool_metrics import PoolMeter, length_percentiles


def _options(tmp_path: Path, model_dir: Path) -> TrainerOptions:
    return TrainerOptions(
        manager="127.0.0.1:1",
        weight_server="http://127.0.0.1:1",
        model_dir=str(model_dir),
        run_dir=str(tmp_path / "run"),
        nats_url="nats://127.0.0.1:1",
    )


def test_unreachable_mlflow_server_stops_the_trainer_at_start(tmp_path: Path, tiny_model_dir: Path) -> None:
    from trainer.loop import Trainer

    spec = tiny_spec()
    spec.logging = LoggingSpec(backends=["jsonl", "mlflow"], mlflow_tracking_uri=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(TrackingError, match=r"logging.mlflowTrackingUri .* does not answer"):
        Trainer(spec, _options(tmp_path, tiny_model_dir))


def test_unwritable_export_path_stops_the_trainer_at_start(tmp_path: Path, tiny_model_dir: Path) -> None:
    from trainer.loop import Trainer

    (tmp_path / "file").write_text("")
    spec = tiny_spec()
    spec.export = ExportSpec(path=str(tmp_path / "file" / "policy"))
    with pytest.raises(ExportError, match=r"export.path .*cannot create"):
        Trainer(spec, _options(tmp_path, tiny_model_dir))


def _status(*workers: tuple[str, Pool, int], migrations: int = 0) -> ManagerStatus:
    return ManagerStatus(
        [WorkerStatus(w, pool, "n", 0, 0, 8, tokens, False) for w, pool, tokens in workers], 0, 0, 0, migrations, 0
    )


def test_pool_meter_rates_lost_workers_and_cost() -> None:
    spec = tiny_spec()
    spec.rollout.reserved.gpus_per_worker, spec.rollout.spot.gpus_per_worker = 1, 1
    meter = PoolMeter(spec, now=0.0)
    first = meter.update(_status(("r0", Pool.RESERVED, 100), ("s0", Pool.SPOT, 50), ("s1", Pool.SPOT, 50)), 10.0)
    assert first.tokens_per_second == {"reserved": 10.0, "spot": 10.0} and first.workers == {"reserved": 1, "spot": 2}
    second = meter.update(_status(("r0", Pool.RESERVED, 300), ("s0", Pool.SPOT, 150), migrations=3), 20.0)
    assert second.tokens_per_second == {"reserved": 20.0, "spot": 10.0}
    assert second.workers_lost == 1 and second.migrations == 3
    hour = spec.prices.reserved_per_gpu_hour + 2 * spec.prices.spot_per_gpu_hour  # rate after the first read
    assert second.cost_so_far == pytest.approx(
        (hour + spec.prices.reserved_per_gpu_hour + spec.prices.spot_per_gpu_hour) * 10 / 3600
    )
    assert meter.update(None, 30.0).cost_so_far > second.cost_so_far  # no status: the last rate goes on


def test_pool_meter_spot_busy_fraction_is_busy_seconds_over_spot_worker_time() -> None:
    meter = PoolMeter(tiny_spec(), now=0.0)
    spot = (("s0", Pool.SPOT, 0), ("s1", Pool.SPOT, 0), ("r0", Pool.RESERVED, 0))
    first, reads = _status(*spot), []
    for busy, now in ((5.0, 10.0), (20.0, 20.0), (2.0, 30.0)):  # the last: a restarted manager counts from zero
        first.busy_seconds = {"spot": busy, "reserved": 99.0}
        reads.append(meter.update(first, now).spot_busy_fraction)
    assert reads == pytest.approx([0.25, 0.75, 0.1])
    assert meter.update(_status(("r0", Pool.RESERVED, 0)), 40.0).spot_busy_fraction == 0.0  # no spot workers


def test_length_percentiles() -> None:
    assert length_percentiles([]) == {"p50": 0.0, "p90": 0.0, "max": 0.0}
    assert length_percentiles(list(range(1, 11))) == {"p50": 5.0, "p90": 9.0, "max": 10.0}
