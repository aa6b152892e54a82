"""rlboost.tracking: each backend writes what its own reader reads back (JSONL lines; TensorBoard's
EventAccumulator; an MLflow file store through MLflow's client; a W&B offline run directory), every numeric field
of a step report is logged, and a backend that cannot work fails before the first step naming
spec.logging.backends and the fix. An unreachable MLflow server is a loopback port nothing listens on."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.nats_server import free_port
from rlboost.spec import LoggingSpec
from rlboost.tracking import TrackingError, check_backends, open_trackers, step_metrics, tracking_dir
from rlboost.wire.events import StepReport

REPO = Path(__file__).resolve().parents[2]
STEPS = [{"reward_mean": 0.25, "loss": 0.5, "finish_reasons/stop": 4.0}, {"reward_mean": 0.75, "loss": -0.5}]


def _log_two_steps(spec: LoggingSpec, run_dir: Path) -> None:
    trackers = open_trackers(spec, run_dir, job="t")
    for step, metrics in enumerate(STEPS):
        trackers.log(step, metrics)
    trackers.close()


def _report(**extra: object) -> StepReport:
    return StepReport(
        step=3,
        weight_version=4,
        weights_checksum="ab",
        reward_mean=0.5,
        tokens=10,
        rollout_seconds=1.0,
        train_seconds=0.5,
        sync_seconds=0.25,
        finish_reasons={"stop": 3},
        response_length={"p50": 2.0, "max": 4.0},
        **extra,
    )


def test_step_metrics_are_every_numeric_field_nested_ones_flattened() -> None:
    metrics = step_metrics(_report())
    assert "step" not in metrics and "weights_checksum" not in metrics  # the step is the x axis; strings are not
    assert metrics["reward_mean"] == 0.5 and metrics["sync_seconds"] == 0.25 and metrics["tokens"] == 10.0
    assert metrics["finish_reasons/stop"] == 3.0 and metrics["response_length/max"] == 4.0
    numeric = {n for n, f in StepReport.model_fields.items() if f.annotation in (int, float) and n != "step"}
    assert numeric <= set(metrics)


def test_fields_added_to_the_report_later_flow_through() -> None:
    class WithLater(StepReport):  # what a field added later (as validation metrics were) looks like
        later: dict[str, float] = {}
        passed: bool = True

    metrics = step_metrics(WithLater(**_report().model_dump(), later={"pass_at_1": 0.5}))
    assert metrics["later/pass_at_1"] == 0.5 and "passed" not in metrics


def test_jsonl_writes_one_line_per_step_in_logging_dir(tmp_path: Path) -> None:
    _log_two_steps(LoggingSpec(), tmp_path)  # the default: jsonl in <run dir>/tracking
    lines = [json.loads(x) for x in (tmp_path / "tracking" / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in x.items() if k not in ("step", "time")} for x in lines] == STEPS
    assert [x["step"] for x in lines] == [0, 1] and all(x["time"] > 0 for x in lines)


def test_logging_dir_relative_to_the_run_dir_or_absolute(tmp_path: Path) -> None:
    assert tracking_dir(LoggingSpec(dir="logs"), tmp_path) == tmp_path / "logs"
    assert tracking_dir(LoggingSpec(dir=str(tmp_path / "abs")), Path("/elsewhere")) == tmp_path / "abs"


def test_tensorboard_event_files_read_back_with_event_accumulator(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_two_steps(LoggingSpec(backends=["tensorboard"], dir=str(tmp_path)), tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"reward_mean", "loss", "finish_reasons/stop"}
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(0, 0.25), (1, 0.75)]


def test_mlflow_file_store_read_back_with_mlflow_client(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    spec = LoggingSpec(backends=["mlflow"], project="exp-1", run_name="run-a")
    _log_two_steps(spec, tmp_path)
    client = MlflowClient(tracking_uri=(tmp_path / "tracking" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("exp-1")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run-a" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(0, 0.25), (1, 0.75)]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "finish_reasons/stop")] == [4.0]


def test_mlflow_leaves_out_values_it_refuses(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    trackers = open_trackers(LoggingSpec(backends=["mlflow"]), tmp_path)
    trackers.log(0, {"loss": math.nan, "reward_mean": 1.0})
    trackers.close()
    client = MlflowClient(tracking_uri=(tmp_path / "tracking" / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("rlboost").experiment_id])
    assert run.data.metrics == {"reward_mean": 1.0}


def test_wandb_offline_writes_a_run_directory(tmp_path: Path) -> None:
    """W&B starts its own service process; run in a child so its threads and handlers end with it."""
    pytest.importorskip("wandb")
    script = (
        "import sys; from pathlib import Path; from rlboost.spec import LoggingSpec; "
        "from rlboost.tracking import open_trackers; "
        "t = open_trackers(LoggingSpec(backends=['wandb'], project='p'), Path(sys.argv[1]), job='j'); "
        "t.log(0, {'reward_mean': 0.5}); t.log(1, {'reward_mean': 0.75}); t.close()"
    )
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": ":".join(sys.path),
    }
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=180, cwd=REPO
    )
    assert res.returncode == 0, res.stderr[-3000:]
    runs = list((tmp_path / "tracking" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), res.stderr[-2000:]


def test_wandb_online_without_credentials_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    monkeypatch.setitem(sys.modules, "wandb", type(sys)("wandb"))  # installed or not: the check comes first
    with pytest.raises(TrackingError, match=r"logging.backends includes 'wandb'.*WANDB_API_KEY.*WANDB_MODE=offline"):
        open_trackers(LoggingSpec(backends=["wandb"]), tmp_path)
    with pytest.raises(TrackingError, match="WANDB_API_KEY"):
        check_backends(LoggingSpec(backends=["wandb"]))


def test_missing_library_names_the_backend_and_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(TrackingError, match=r"logging.backends includes 'mlflow'.*pip install 'mlflow-skinny'"):
        open_trackers(LoggingSpec(backends=["jsonl", "mlflow"]), tmp_path)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(TrackingError, match=r"'tensorboard'.*rlboost\[tracking\]"):
        check_backends(LoggingSpec(backends=["tensorboard"]))


def test_unreachable_mlflow_server_fails_before_any_run(tmp_path: Path) -> None:
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = LoggingSpec(backends=["jsonl", "mlflow"], mlflow_tracking_uri=uri)
    with pytest.raises(TrackingError, match=r"logging.mlflowTrackingUri .* does not answer.*logging.backends"):
        open_trackers(spec, tmp_path)
    with pytest.raises(TrackingError, match="does not answer"):
        check_backends(spec)


def test_rlboost_local_refuses_an_unreachable_mlflow_server_before_starting(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"logging: {{backends: [mlflow], mlflowTrackingUri: 'http://127.0.0.1:{free_port()}'}}\n")
    res = subprocess.run(
        [sys.executable, "-m", "rlboost.cli.main", "local", "--config", str(cfg), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "logging.mlflowTrackingUri" in res.stderr and "logging.backends" in res.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_spec_rejects_unknown_or_repeated_backends() -> None:
    from rlboost.spec import JobSpecError, parse_job_spec

    with pytest.raises(JobSpecError, match=r"logging.backends.0: Input should be 'jsonl', 'tensorboard'"):
        parse_job_spec({"logging": {"backends": ["neptune"]}})
    with pytest.raises(JobSpecError, match="names jsonl twice"):
        parse_job_spec({"logging": {"backends": ["jsonl", "jsonl"]}})
    with pytest.raises(JobSpecError, match=r"export.everyCheckpoints needs export.path"):
        parse_job_spec({"export": {"everyCheckpoints": 2}})
    with pytest.raises(JobSpecError, match=r"export.path 'ftp://x/y': use a directory, s3://"):
        parse_job_spec({"export": {"path": "ftp://x/y"}})
