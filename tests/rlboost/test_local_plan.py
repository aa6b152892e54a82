"""The local plan (pure): every child's command line and flags, ports, paths; and the default example file."""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

from rlboost.cpu_numerics import CPU_NUMERICS_ENV
from rlboost.local import plan as plan_module
from rlboost.local.plan import CoreSplit, LocalOptions, build_plan, core_split, initial_spot_workers, trainer_threads
from rlboost.local.progress import ProgressState, sparkline
from rlboost.local.report import LocalReport, counters_from_status, plot_rewards, write_report
from rlboost.spec import JobSpec, load_job_spec
from rlboost.wire.events import StepReport
from rlboost.wire.rollout_io import ManagerStatus

REPO = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path, **opts: object):
    ports = itertools.count(20000)
    options = LocalOptions(run_dir=tmp_path / "run", python="/py", **opts)
    return build_plan(JobSpec(), options, lambda: next(ports), nats_binary="/bin/nats-server")


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_children_in_start_order_with_distinct_ports(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    names = [c.name for c in plan.children]
    assert names == ["nats", "weight-server", "rollout-manager", "reserved-0", "spot-0", "spot-1", "trainer"]
    ports = [c.ready_port for c in plan.children]
    assert len(set(ports)) == len(ports)
    assert plan.child("nats").argv == ["/bin/nats-server", "-c", str(plan.nats_config_file)]


def test_nats_configuration_listens_on_the_plan_port_with_the_job_users(tmp_path: Path) -> None:
    import json

    from rlboost.auth.credentials import generate

    plan = _plan(tmp_path)
    generate(plan.credentials_dir)
    config = json.loads(plan.nats_config_text())
    assert config["listen"] == f"127.0.0.1:{plan.nats_port}"
    assert config["jetstream"]["store_dir"] == str(plan.options.run_dir / "nats")
    users = {u["user"]: u for u in config["authorization"]["users"]}
    assert set(users) == {"operator", "trainer", "manager", "worker", "weight-server", "observer"}
    assert users["trainer"]["password"] == (plan.credentials_dir / "nats-trainer.pass").read_text().strip()


def test_service_flags_follow_the_contract(tmp_path: Path) -> None:
    plan = _plan(tmp_path, dump_rollouts=tmp_path / "r.jsonl")
    run = tmp_path / "run"
    for c in plan.children[1:]:
        assert c.argv[:3] == ["/py", "-m", c.role.replace("-", "_")]
        assert _flag(c.argv, "--config") == str(run / "job.yaml")
        assert _flag(c.argv, "--nats-url") == plan.nats_url
        assert _flag(c.argv, "--namespace") == "local" and _flag(c.argv, "--job") == "local"
    ws = plan.child("weight-server").argv
    assert _flag(ws, "--port") == str(plan.weight_server_port)
    assert _flag(ws, "--data-dir") == str(run / "weights") and "--token-file" not in ws  # credentials: the tokens
    assert _flag(ws, "--credentials-dir") == str(run / "credentials")
    mgr = plan.child("rollout-manager")
    assert _flag(mgr.argv, "--port") == str(plan.manager_port)
    assert mgr.health_url == f"http://127.0.0.1:{plan.manager_metrics_port}/healthz"
    w = plan.child("spot-1").argv
    assert _flag(w, "--worker-id") == "spot-1" and _flag(w, "--pool") == "spot" and _flag(w, "--node") == "local-spot-1"
    assert _flag(w, "--manager") == f"127.0.0.1:{plan.manager_port}"
    assert _flag(w, "--weight-server") == f"http://127.0.0.1:{plan.weight_server_port}"
    assert _flag(w, "--model-dir") == str(run / "model")
    tr = plan.child("trainer").argv
    assert _flag(tr, "--run-dir") == str(run) and _flag(tr, "--dump-rollouts") == str(tmp_path / "r.jsonl")
    assert "--token-file" not in tr and _flag(tr, "--credentials-dir") == str(run / "credentials")
    assert "--dump-rollouts" not in _plan(tmp_path).child("trainer").argv


def test_pool_sizes_and_new_spot_workers(tmp_path: Path) -> None:
    spec = JobSpec.model_validate({"rollout": {"reserved": {"replicas": 2}, "spot": {"replicas": 0}}})
    options = LocalOptions(run_dir=tmp_path, python="/py")
    ports = itertools.count(30000)
    plan = build_plan(spec, options, lambda: next(ports))
    assert [c.name for c in plan.children if c.role == "rollout-worker"] == ["reserved-0", "reserved-1"]
    extra = plan.worker("spot-7", "spot")
    assert extra.pool == "spot" and extra.ready_port not in {c.ready_port for c in plan.children}
    bounded = JobSpec.model_validate({"rollout": {"spot": {"replicas": 2, "minReplicas": 1, "maxReplicas": 3}}})
    assert initial_spot_workers(bounded, None) == 2
    assert initial_spot_workers(bounded, 0) == 1 and initial_spot_workers(bounded, 12) == 3


def test_model_path_from_spec_wins(tmp_path: Path) -> None:
    spec = JobSpec.model_validate({"model": {"path": str(tmp_path / "m")}})
    plan = build_plan(spec, LocalOptions(run_dir=tmp_path / "run"), itertools.count(40000).__next__)
    assert plan.model_dir == tmp_path / "m"
    assert _flag(plan.child("trainer").argv, "--model-dir") == str(tmp_path / "m")


def test_every_torch_process_gets_the_pinned_cpu_numerics(tmp_path: Path) -> None:
    """Trainer ranks (first start and restart) and workers start with AVX2 arithmetic: the default job's pinned
    checksum then holds on AVX-512 machines too (rlboost.cpu_numerics). Its values stay defaults the user's
    environment overrides (the supervisor's merge, tests/rlboost/test_supervisor.py)."""
    plan = _plan(tmp_path, checkpoint_dir=tmp_path / "checkpoints")
    torch_children = [c for c in plan.children if c.role in ("trainer", "rollout-worker")]
    assert len(torch_children) == 4
    for child in [*torch_children, *plan.restart_of("trainer")]:
        assert CPU_NUMERICS_ENV.items() <= child.env.items(), child.name
    ports = itertools.count(21000)
    two_ranks = JobSpec.model_validate({"trainer": {"ranks": 2}})
    ranks = build_plan(two_ranks, plan.options, lambda: next(ports), nats_binary="/bin/nats-server").children
    assert [c.env["ATEN_CPU_CAPABILITY"] for c in ranks if c.role == "trainer"] == ["avx2", "avx2"]


def test_a_single_rank_trainer_takes_the_cores_the_workers_leave(tmp_path: Path, monkeypatch) -> None:
    """One torch thread per worker beside it, the rest to the trainer (at least one): on 2 cores with the default
    3 workers, 1 (a second one spun while the workers wanted the cores: docs/benchmarks.md)."""
    assert [trainer_threads(JobSpec(), cores) for cores in (1, 2, 4, 16)] == [1, 1, 1, 13]
    monkeypatch.setattr(plan_module, "available_cores", lambda: 8)
    plan = _plan(tmp_path)
    assert plan.child("trainer").env["OMP_NUM_THREADS"] == "5"
    assert plan.restart_of("trainer")[0].env["OMP_NUM_THREADS"] == "5"
    workers = [c.env["OMP_NUM_THREADS"] for c in plan.children if c.role == "rollout-worker"]
    assert workers == ["1", "1", "1"]


AHEAD = {"algorithm": {"maxStaleness": 1, "rolloutAhead": 1}}


def test_a_rollout_one_step_ahead_puts_the_trainer_and_the_services_on_cpus_of_their_own() -> None:
    """The trainer takes max(ranks, trainer_threads) CPUs, leaving at least one to the services; on-policy runs, GPU
    runs, one CPU and a rank per CPU or more are not split (docs/benchmarks.md: split, those steps were slower)."""
    ahead = JobSpec.model_validate(AHEAD)
    assert core_split(ahead, [0, 1]) == CoreSplit((0,), (1,))
    assert core_split(ahead, [7, 3, 5]) == CoreSplit((3,), (5, 7))  # the CPUs allowed, in order
    assert core_split(ahead, list(range(16))) == CoreSplit(tuple(range(13)), (13, 14, 15))
    two_ranks = JobSpec.model_validate({**AHEAD, "trainer": {"ranks": 2}})
    assert core_split(two_ranks, [0, 1, 2]) == CoreSplit((0, 1), (2,))
    assert core_split(two_ranks, [0, 1]) is None  # split, both ranks would share one CPU
    assert core_split(ahead, [0]) is None
    assert core_split(JobSpec(), [0, 1]) is None
    gpu = JobSpec.model_validate({**AHEAD, "rollout": {"reserved": {"gpusPerWorker": 1}}})
    assert core_split(gpu, [0, 1]) is None


def test_the_plan_gives_every_child_its_cpus_also_restarts_and_later_spot_workers(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(plan_module, "allowed_cores", lambda: [0, 1, 2, 3])
    ports = itertools.count(22000)
    options = LocalOptions(run_dir=tmp_path / "run", python="/py")
    plan = build_plan(JobSpec.model_validate(AHEAD), options, lambda: next(ports), nats_binary="/bin/nats-server")
    assert plan.child("trainer").cores == (0,) and plan.child("trainer").env["OMP_NUM_THREADS"] == "1"
    assert plan.restart_of("trainer")[0].cores == (0,)
    others = [c for c in plan.children if c.role != "trainer"]
    assert len(others) == 6 and all(c.cores == (1, 2, 3) for c in others)
    assert plan.worker("spot-9", "spot").cores == (1, 2, 3)
    on_policy = _plan(tmp_path)
    assert on_policy.split is None and all(c.cores == () for c in on_policy.children)


def test_examples_local_yaml_equals_the_embedded_default() -> None:
    path = REPO / "examples" / "local.yaml"
    assert load_job_spec(path) == JobSpec()
    # Every field is written out, so the file documents the whole default.
    assert yaml.safe_load(path.read_text()) == JobSpec().model_dump(by_alias=True, mode="json")


def test_report_json_and_plot(tmp_path: Path) -> None:
    steps = [
        StepReport(
            step=i,
            reward_mean=0.1 * i,
            tokens=10,
            rollout_seconds=1,
            train_seconds=0.5,
            sync_seconds=0.1,
            weight_version=i,
            weights_checksum=f"c{i}",
        )
        for i in (1, 2)
    ]
    report = LocalReport(steps=steps, final_weights_checksum="ab", preemptions=1)
    write_report(report, tmp_path / "r.json")
    data = yaml.safe_load((tmp_path / "r.json").read_text())
    assert {
        "step",
        "reward_mean",
        "reward_std",
        "tokens",
        "rollout_seconds",
        "train_seconds",
        "sync_seconds",
        "weight_version",
        "weights_checksum",
        "loss",
        "kl",
        "entropy",
        "grad_norm",
        "learning_rate",
        "trainer_idle_seconds",
        "train_compute_seconds",
    } <= set(data["steps"][0])
    for key in ("final_weights_checksum", "preemptions", "migrations", "tokens_lost", "tokens_regenerated", "workers"):
        assert key in data
    png = plot_rewards(steps, tmp_path / "reward.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_rewards([], tmp_path / "none.png") is None


def test_report_holds_the_trainer_step_record_as_published() -> None:
    event = StepReport(
        step=3,
        reward_mean=0.5,
        reward_std=0.2,
        tokens=9,
        rollout_seconds=1.0,
        train_seconds=0.5,
        sync_seconds=0.1,
        weight_version=4,
        weights_checksum="cd",
        loss=-0.1,
        grad_norm=2.5,
        learning_rate=1e-3,
        trainer_idle_seconds=0.7,
        ranks=2,
        finish_reasons={"stop": 3},
    )
    report = LocalReport(steps=[StepReport.model_validate_json(event.model_dump_json())])
    assert report.steps == [event]
    assert LocalReport.model_validate_json(report.model_dump_json()).steps == [event]


def test_report_counters_come_from_the_manager_status() -> None:
    status = ManagerStatus(
        workers=[],
        pending=0,
        running=0,
        finished=8,
        migrations=3,
        tokens_received=40,
        tokens_lost=2,
        tokens_regenerated=1,
        migrations_by_reason={"rebalance": 0, "drained": 3},
    )
    report = LocalReport(**counters_from_status(status))
    assert (report.migrations, report.tokens_received, report.tokens_lost, report.tokens_regenerated) == (3, 40, 2, 1)
    assert report.migrations_by_reason == {"drained": 3}
    assert LocalReport(**counters_from_status(None)) == LocalReport()


def test_sparkline_and_progress_state() -> None:
    assert sparkline([0, 1]) == "▁█"
    assert sparkline([2, 2, 2]) == "▁▁▁"
    assert sparkline([]) == ""
    assert len(sparkline(list(range(100)), width=30)) == 30
    assert ProgressState(total_steps=3).phase == "starting"
