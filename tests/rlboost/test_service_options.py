"""Every service's options, written once (rlboost.options): rendered for `rlboost local` and for the operator's
pods from the default spec, parsed back by the parser each service's `__main__` uses, and bad values named."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import pytest

from rlboost.local.plan import ChildPlan, LocalOptions, build_plan
from rlboost.models import fetch
from rlboost.options import (
    ANY_ADDRESS,
    LOOPBACK,
    SERVICES,
    EnvRunnerOptions,
    ManagerOptions,
    ModelFetchOptions,
    OptionsError,
    ServiceOptions,
    TrainerOptions,
    WeightServerOptions,
    WorkerOptions,
    env_runner_options,
    manager_options,
    parse_service_args,
    trainer_options,
    weight_server_options,
    worker_options,
)
from rlboost.options.base import env_name, flag_of
from rlboost.spec import JobSpec, dump_job_spec, load_job_spec
from rlboost_operator import children
from rlboost_operator.config import OperatorSettings

REPO = Path(__file__).resolve().parents[2]
BY_MODULE = {options.MODULE: options for options in SERVICES}
DEFAULT_SPECS = {
    "spec.py defaults": JobSpec(),
    "examples/local.yaml": load_job_spec(REPO / "examples" / "local.yaml"),
    "examples/rljob.yaml": load_job_spec(REPO / "examples" / "rljob.yaml"),
    "examples/local-agent.yaml": load_job_spec(REPO / "examples" / "local-agent.yaml"),  # env-runners too
}


def _services(spec: JobSpec) -> set[type[ServiceOptions]]:
    """The services a job runs: env-runners only with task.environment (agentic episodes)."""
    return set(SERVICES) if spec.task.episodes else set(SERVICES) - {EnvRunnerOptions}


@pytest.fixture(autouse=True)
def _no_rlboost_flag_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags default to RLBOOST_<FLAG>: none may leak in from the test's environment."""
    for options in SERVICES:
        for name in options.model_fields:
            monkeypatch.delenv(env_name(flag_of(name)[2:]), raising=False)


def _parsed(command: list[str]) -> ServiceOptions:
    """A `python -m <module> <flags>` command parsed by the options model that module's `__main__` uses."""
    assert command[1] == "-m", command
    options = BY_MODULE[command[2]]
    main = importlib.import_module(f"{options.MODULE}.__main__")
    assert options in vars(main).values(), f"{options.MODULE}.__main__ does not parse with {options.__name__}"
    return options.from_argv(command[3:])


def _local_children(spec: JobSpec, run_dir: Path) -> list[ChildPlan]:
    ports = itertools.count(20000)
    plan = build_plan(spec, LocalOptions(run_dir=run_dir, python="/py"), lambda: next(ports), nats_binary="/nats")
    return [child for child in plan.children if child.role != "nats"]


SETTINGS = OperatorSettings(nats_url="nats://nats:4222")


def _pod_containers(spec: JobSpec) -> list[dict]:
    objs = children.build_children("job1", "ns1", spec, SETTINGS, 2)
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    # every rlboost service's container; the job's NATS runs nats-server, not one of ours
    return [container for pod in pods for container in pod["containers"] if container["name"] != "nats"]


@pytest.mark.parametrize("spec", DEFAULT_SPECS.values(), ids=DEFAULT_SPECS.keys())
def test_local_commands_parse_back_into_what_was_rendered(spec: JobSpec, tmp_path: Path) -> None:
    local = _local_children(spec, tmp_path)
    assert {type(child.options) for child in local} == _services(spec)  # every service is covered
    for child in local:
        assert _parsed(child.argv) == child.options, child.name
        assert child.options.host == LOOPBACK and child.options.config == str(tmp_path / "job.yaml"), child.name
    worker = next(child.options for child in local if child.name == "spot-0")
    assert (worker.pool, worker.node, worker.model_dir) == ("spot", "local-spot-0", str(tmp_path / "model"))
    # The job file the plan names is what every service loads.
    (tmp_path / "job.yaml").write_text(dump_job_spec(spec))
    trainer = next(child for child in local if child.name == "trainer")
    assert parse_service_args(TrainerOptions, trainer.argv[3:]).spec == spec


def _expected_pod_options(spec: JobSpec, settings: OperatorSettings) -> dict[type, ServiceOptions]:
    """What each pod should run: the rendering functions, for the operator's Site."""
    site, port = children.site("job1", "ns1", settings), children.METRICS_PORT
    return {
        ManagerOptions: manager_options(site, children.MANAGER_PORT, port),
        WeightServerOptions: weight_server_options(site, children.WEIGHTS_PORT, "/data"),
        # pulls its model; waits longer for the first version than locally (it follows the trainer's model fetch);
        # proves who it is with its projected service-account token
        WorkerOptions: worker_options(
            site, "$(POD_NAME)", "spot", "$(NODE_NAME)", "", port, peer_port=children.PEER_PORT
        ).model_copy(
            update={
                "startup_timeout": children.WORKER_STARTUP_TIMEOUT_S,
                "identity_token_file": children.IDENTITY_TOKEN,
            }
        ),
        EnvRunnerOptions: env_runner_options(site, "$(POD_NAME)", "$(NODE_NAME)", "", port).model_copy(
            update={"startup_timeout": children.ENV_RUNNER_STARTUP_TIMEOUT_S}  # its tokenizer: the trainer's assets
        ),
        TrainerOptions: trainer_options(
            site,
            children.model_dir(spec.model),
            "/data/run",
            port,
            checkpoint_dir=Path(children.CHECKPOINT_DIR),
            resume=True,
        ),
    }


@pytest.mark.parametrize("spec", DEFAULT_SPECS.values(), ids=DEFAULT_SPECS.keys())
def test_pod_commands_parse_back_and_listen_where_probes_and_prometheus_reach(spec: JobSpec) -> None:
    containers, expected = _pod_containers(spec), _expected_pod_options(spec, SETTINGS)
    assert {BY_MODULE[c["command"][2]] for c in containers} == _services(spec)
    for container in containers:
        parsed = _parsed(container["command"])
        if container["name"] != "rollout-worker" or parsed.pool == "spot":  # the expected worker is a spot one
            assert parsed == expected[type(parsed)], container["name"]
        assert parsed.host == ANY_ADDRESS, container["name"]  # not loopback: the kubelet dials the pod's IP
        assert parsed.config == children.CONFIG_PATH and parsed.job == "job1" and parsed.namespace == "ns1"
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        served = {
            "metrics": getattr(parsed, "metrics_port", None),
            "http": getattr(parsed, "port", None),
            "peers": getattr(parsed, "peer_port", None),
        }
        if isinstance(parsed, ManagerOptions):
            served["grpc"] = parsed.port
        for name, port in ports.items():
            assert name == "rendezvous" or served.get(name) == port, (container["name"], name)
        for probe in ("readinessProbe", "livenessProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in ports, (container["name"], probe)


def test_pod_and_local_commands_differ_only_in_deployment_facts(tmp_path: Path) -> None:
    spec = DEFAULT_SPECS["examples/local-agent.yaml"]  # every service, env-runners included
    local = {type(c.options): c.options for c in _local_children(spec, tmp_path)}
    pods = {type(p): p for p in (_parsed(c["command"]) for c in _pod_containers(spec))}
    # checkpoint_dir, resume: a pod's trainer always resumes from its PVC; `rlboost local` only when asked.
    facts = {
        "config",
        "nats_url",
        "namespace",
        "job",
        "host",
        "port",
        "metrics_port",
        "manager",
        "weight_server",
        "credentials_dir",
        "model_dir",
        "run_dir",
        "data_dir",
        "worker_id",
        "node",
        "pool",
        "checkpoint_dir",
        "resume",
        "startup_timeout",
        "peer_port",
        "identity_token_file",
        "runner_id",
    }
    for options in SERVICES:
        differ = {f for f in options.model_fields if getattr(local[options], f) != getattr(pods[options], f)}
        assert differ <= facts, (options.__name__, differ - facts)


def test_rendered_options_round_trip_through_argv() -> None:
    samples = [
        ManagerOptions(port=1, metrics_port=0, offload_window=2.5, balance_interval=0.25, nats_url=""),
        WeightServerOptions(chunk_bytes=4096, no_nats=True, read_token_file="/r", log_level="debug"),
        WorkerOptions(worker_id="w", pool="spot", manager="[::1]:5", weight_server="", capacity=3, engine="sglang"),
        TrainerOptions(steps=2, checkpoint_dir="/c", resume=True, colocation_timeout=0.5, dump_rollouts="/d"),
        EnvRunnerOptions(runner_id="r", capacity=4, drain_timeout=1.5, model_dir="/m"),
    ]
    for opts in samples:
        assert type(opts).from_argv(opts.to_argv()) == opts
        assert opts.command("/py")[:3] == ["/py", "-m", type(opts).MODULE]


def test_unset_flags_take_the_models_defaults_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerOptions.from_argv([]) == WorkerOptions()
    assert WorkerOptions().manager == f"{LOOPBACK}:{ManagerOptions().port}"  # one place for the manager's port
    assert TrainerOptions().weight_server == f"http://{LOOPBACK}:{WeightServerOptions().port}"
    monkeypatch.setenv("RLBOOST_METRICS_PORT", "9999")
    monkeypatch.setenv("RLBOOST_RESUME", "1")
    monkeypatch.setenv("RLBOOST_CHECKPOINT_DIR", "/ck")
    trainer = TrainerOptions.from_argv([])
    assert (trainer.metrics_port, trainer.resume, trainer.checkpoint_dir) == (9999, True, "/ck")
    assert TrainerOptions.from_argv(["--metrics-port", "1"]).metrics_port == 1  # the flag wins


@pytest.mark.parametrize(
    ("options", "argv", "named"),
    [
        (ManagerOptions, ["--port", "70000"], "--port"),
        (ManagerOptions, ["--balance-interval", "0"], "--balance-interval"),
        (WeightServerOptions, ["--chunk-bytes", "0"], "--chunk-bytes"),
        (WorkerOptions, ["--capacity", "-1"], "--capacity"),
        (WorkerOptions, ["--pool", "cheap"], "--pool"),
        (WorkerOptions, ["--manager", "nohost"], "--manager"),
        (TrainerOptions, ["--steps", "0"], "--steps"),
        (TrainerOptions, ["--log-level", "LOUD"], "--log-level"),
        (TrainerOptions, ["--resume"], "--checkpoint-dir"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_flag(options, argv, named, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(OptionsError) as err:
        options.from_argv(argv)
    assert named in str(err.value)
    with pytest.raises(SystemExit) as exit_:
        parse_service_args(options, argv)
    stderr = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(stderr) == 1
    assert stderr[0].startswith(f"rlboost serve {options.SERVICE}: ") and named in stderr[0]


def test_a_bad_environment_value_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLBOOST_CAPACITY", "many")
    with pytest.raises(OptionsError) as err:
        WorkerOptions.from_argv([])
    assert [p.flag for p in err.value.problems] == ["--capacity (or RLBOOST_CAPACITY)"] and "'many'" in str(err.value)


def test_a_bad_job_spec_is_one_line_per_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("algorithm:\n  groupSize: 1\n")
    with pytest.raises(SystemExit):
        parse_service_args(ManagerOptions, ["--config", str(config)])
    assert "algorithm.groupSize" in capsys.readouterr().err


def test_workers_of_accelerator_pools_run_on_cuda_in_bf16_both_ways(tmp_path: Path) -> None:
    """gpusPerWorker >= 1 renders --device cuda --dtype bfloat16 for that pool's workers, locally and in pods;
    CPU pools keep the CPU defaults."""
    spec = JobSpec.model_validate({"rollout": {"spot": {"gpusPerWorker": 1}}})
    local = {c.name: c.options for c in _local_children(spec, tmp_path)}
    assert (local["spot-0"].device, local["spot-0"].dtype) == ("cuda", "bfloat16")
    assert (local["reserved-0"].device, local["reserved-0"].dtype) == ("cpu", "float32")
    pods = {
        _parsed(c["command"]).pool: _parsed(c["command"]) for c in _pod_containers(spec) if "--pool" in c["command"]
    }
    assert (pods["spot"].device, pods["reserved"].device) == ("cuda", "cpu")


def test_model_fetch_options_round_trip_through_argv_with_the_flags_of_old() -> None:
    opts = ModelFetchOptions(config="/etc/job.yaml", dest="/models/policy", termination_log="/dev/termination-log")
    assert ModelFetchOptions.from_argv(opts.to_argv()) == opts
    assert opts.command() == [
        "python",
        "-m",
        "rlboost.models.fetch",
        "--config",
        "/etc/job.yaml",
        "--dest",
        "/models/policy",
        "--termination-log",
        "/dev/termination-log",
    ]
    with_token = opts.model_copy(update={"token_file": "/t"})
    assert ModelFetchOptions.from_argv(with_token.to_argv()) == with_token
    assert ModelFetchOptions in vars(fetch).values()  # what the fetcher's main parses with


@pytest.mark.parametrize("spec", DEFAULT_SPECS.values(), ids=DEFAULT_SPECS.keys())
def test_the_pods_model_fetch_init_container_parses_back(spec: JobSpec) -> None:
    objs = children.build_children("job1", "ns1", spec, SETTINGS, 2)
    pods = [o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    inits = [c for pod in pods for c in pod.get("initContainers", []) if c["name"] == children.FETCH_CONTAINER]
    assert inits  # the trainer's pod fetches its model at least
    expected = ModelFetchOptions(
        config=children.CONFIG_PATH, dest=children.model_dir(spec.model), termination_log=children.TERMINATION_LOG
    )
    for container in inits:
        assert container["command"][:3] == ["python", "-m", ModelFetchOptions.MODULE]
        assert ModelFetchOptions.from_argv(container["command"][3:]) == expected


def test_model_fetch_flags_are_required_bounded_and_not_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_:
        ModelFetchOptions.from_argv(["--config", "/etc/job.yaml"])
    assert exit_.value.code == 2 and "--dest" in capsys.readouterr().err
    with pytest.raises(OptionsError) as err:
        ModelFetchOptions.from_argv(["--config", "", "--dest", "/m"])
    assert [p.flag for p in err.value.problems] == ["--config"]
    monkeypatch.setenv("RLBOOST_TOKEN_FILE", "/weight-server-token")  # another command's variable
    assert ModelFetchOptions.from_argv(["--config", "c", "--dest", "d"]).token_file == ""
